//! A data-plane connection, plain TCP, TLS or the same-host Unix socket, as
//! one stream type the framing code reads and writes without caring which,
//! and how one is opened (connect, TLS handshake, Hello) within a bound.

use super::{exchange, transport};
use crate::{ClientError, Result};
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use prost::Message;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// Where a data plane listens: a TCP address, or the same-host socket
/// (`server.local_listen`, docs/local.md), where payloads move through shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The TCP data plane.
    Tcp(SocketAddr),
    /// The same-host Unix socket.
    Unix(PathBuf),
}

impl From<SocketAddr> for Target {
    fn from(a: SocketAddr) -> Self {
        Target::Tcp(a)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(a) => write!(f, "{a}"),
            Target::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// TLS towards the data plane: a connector and the name the server's
/// certificate must carry.
#[derive(Clone)]
pub struct WireTls {
    /// rustls connector (roots, optional client certificate).
    pub connector: tokio_rustls::TlsConnector,
    /// The server's name (DNS name or IP address).
    pub server_name: rustls::pki_types::ServerName<'static>,
}

/// A data-plane connection, plain, TLS or same-host.
pub enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// The same-host Unix socket, and the shared memory it brought.
    Unix(Box<UnixConn>),
}

/// A same-host connection, and the segment the server lent it for saves
/// (the tier's segments are mapped once per client: `local::Maps`;
/// docs/local.md).
pub struct UnixConn {
    pub(super) sock: UnixStream,
    /// The segment lent to this connection for saves: its id and mapping.
    pub(super) lent: Option<(u64, kvtier_shm::Mapping)>,
}

impl Conn {
    /// Lets go of a connection a forked child inherited from its parent:
    /// closes only this process's descriptor. Dropping it would also remove
    /// the socket from the epoll instance the two processes share, and the
    /// parent's connection would stop hearing from the server.
    pub(super) fn abandon(self) {
        use std::os::fd::AsRawFd;
        let fd = match &self {
            Conn::Plain(s) => s.as_raw_fd(),
            Conn::Tls(s) => s.get_ref().0.as_raw_fd(),
            Conn::Unix(s) => s.sock.as_raw_fd(),
        };
        let _ = nix::unistd::close(fd);
        std::mem::forget(self);
    }

    /// The TCP socket underneath (none on the same-host socket).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Conn::Plain(s) => Some(s),
            Conn::Tls(s) => Some(s.get_ref().0),
            Conn::Unix(_) => None,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(&mut s.sock).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(&mut s.sock).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Conn::Unix(s) => Pin::new(&mut s.sock).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
            Conn::Unix(s) => s.sock.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Unix(s) => Pin::new(&mut s.sock).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(&mut s.sock).poll_shutdown(cx),
        }
    }
}

/// [`dial`] finished by `by`, or `UNAVAILABLE`.
pub(super) async fn dial_by(
    by: Instant,
    addr: &Target,
    congestion: Option<&str>,
    token: Option<&str>,
    tls: Option<&WireTls>,
    server_uid: Option<u32>,
) -> Result<Conn> {
    let left = by.saturating_duration_since(Instant::now());
    tokio::time::timeout_at(by.into(), dial(addr, congestion, token, tls, server_uid))
        .await
        .unwrap_or_else(|_| {
            Err(transport(
                format!("no connection within {left:?} (connect, TLS handshake, Hello)"),
                addr,
            ))
        })
}

pub(super) async fn dial(
    addr: &Target,
    congestion: Option<&str>,
    token: Option<&str>,
    tls: Option<&WireTls>,
    server_uid: Option<u32>,
) -> Result<Conn> {
    let s = match addr {
        Target::Tcp(a) => dial_tcp(*a, congestion, tls).await?,
        Target::Unix(p) => {
            let s = UnixStream::connect(p)
                .await
                .map_err(|e| transport(e, addr))?;
            // Whoever listens must be the server we mean before it gets the
            // Hello and its token (crate::listener).
            crate::listener::check(&s, &p.to_string_lossy(), server_uid)?;
            Conn::Unix(Box::new(UnixConn {
                sock: s,
                lent: None,
            }))
        }
    };
    hello(s, addr, token).await
}

async fn dial_tcp(
    addr: SocketAddr,
    congestion: Option<&str>,
    tls: Option<&WireTls>,
) -> Result<Conn> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| transport(e, addr))?;
    tcp.set_nodelay(true).map_err(|e| transport(e, addr))?;
    if let Some(cc) = congestion
        && let Err(e) = socket2::SockRef::from(&tcp).set_tcp_congestion(cc.as_bytes())
    {
        // Best effort: the connection works either way, only its pacing differs.
        tracing::debug!(congestion = cc, error = %e, "data plane: congestion control refused");
    }
    Ok(match tls {
        None => Conn::Plain(tcp),
        Some(t) => Conn::Tls(Box::new(
            t.connector
                .connect(t.server_name.clone(), tcp)
                .await
                .map_err(|e| transport(format!("TLS: {e}"), addr))?,
        )),
    })
}

/// Authenticates a new connection with `token` (a Hello frame), if given.
async fn hello(mut s: Conn, addr: &Target, token: Option<&str>) -> Result<Conn> {
    if let Some(token) = token {
        let hello = pb::WireHello {
            token: token.to_string(),
        }
        .encode_to_vec();
        let f = exchange(&mut s, Kind::Hello, 0, hello, &[], &mut super::Sink::Owned)
            .await
            .map_err(|e| transport(e, addr))?;
        match f.header.kind {
            Kind::HelloReply => {}
            Kind::Error => {
                let e = pb::WireError::decode(f.meta)
                    .map_err(|e| transport(format!("bad error frame: {e}"), addr))?;
                return Err(ClientError::Status(tonic::Status::new(
                    tonic::Code::from_i32(e.code),
                    format!("data plane {addr}: {}", e.message),
                )));
            }
            other => return Err(transport(format!("Hello answered with {other:?}"), addr)),
        }
    }
    Ok(s)
}

/// Opening a pool (the listener of a Unix socket checked first, crate::listener).
mod open {
    use super::super::{DEFAULT_MAX_REQUEST, MAX_STRIPES, WireClient};
    use super::{Target, WireTls, dial_by};
    use crate::Result;
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};
    use tokio::sync::Semaphore;

    impl WireClient {
        /// A pool on the same-host socket at `path` whose listener must run as
        /// this process's uid, root or `server_uid` (crate::listener).
        pub async fn connect_local(
            path: &str,
            connections: usize,
            timeout: Duration,
            connect_timeout: Duration,
            token: Option<&str>,
            server_uid: Option<u32>,
        ) -> Result<Self> {
            let uid = crate::listener::expected_uid(server_uid)?;
            let addr = Target::Unix(path.into());
            Self::open(
                addr,
                connections,
                timeout,
                connect_timeout,
                None,
                token,
                None,
                uid,
            )
            .await
        }

        #[allow(clippy::too_many_arguments)]
        pub(in crate::wire) async fn open(
            addr: Target,
            connections: usize,
            timeout: Duration,
            connect_timeout: Duration,
            congestion: Option<&str>,
            token: Option<&str>,
            tls: Option<WireTls>,
            server_uid: Option<u32>,
        ) -> Result<Self> {
            let n = connections.max(1);
            let congestion: Option<Arc<str>> = congestion.filter(|c| !c.is_empty()).map(Arc::from);
            let token: Option<Arc<str>> = token.filter(|t| !t.is_empty()).map(Arc::from);
            let by = Instant::now() + connect_timeout;
            let idle = futures::future::try_join_all((0..n).map(|_| {
                dial_by(
                    by,
                    &addr,
                    congestion.as_deref(),
                    token.as_deref(),
                    tls.as_ref(),
                    server_uid,
                )
            }))
            .await?;
            let copies = matches!(addr, Target::Unix(_));
            Ok(Self {
                maps: Default::default(),
                addr,
                copies: Arc::new(copies.into()),
                owner: Arc::new(AtomicU64::new(std::process::id().into())),
                idle: Arc::new(Mutex::new(idle)),
                slots: Arc::new(Semaphore::new(n)),
                next_id: Arc::new(AtomicU64::new(1)),
                timeout,
                connect_timeout,
                congestion,
                token,
                tls,
                pool: n,
                max_stripes: MAX_STRIPES,
                max_request: Arc::new(AtomicU64::new(DEFAULT_MAX_REQUEST)),
                server_uid,
            })
        }
    }
}
