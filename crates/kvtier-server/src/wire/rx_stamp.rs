//! When a data-plane request really arrived: the kernel's receive timestamp
//! of its first byte (`SO_TIMESTAMPING`, software RX stamps).
//!
//! A request that waits in its socket's receive queue because the server is
//! busy is queued as surely as one waiting for admission, but the server only
//! sees it once it reads the frame header. On a plain TCP connection the
//! header is read with `recvmsg`, which also returns the time the kernel
//! received the bytes, so that wait counts as queue time
//! (`ServerTiming.queue_us`, the request metrics) and the request's
//! deadlines start from its arrival (notes/028 found the data plane's queue
//! forms there). TLS and in-memory streams report no stamp and keep the
//! time the header was read.
use kvtier_proto::wire::HEADER_LEN;
use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, TimestampingFlag, Timestamps, recvmsg, setsockopt, sockopt,
};
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, Interest};
use tokio::net::{TcpListener, TcpStream};

/// Asks the kernel to stamp what `listener`'s connections receive (accepted
/// sockets inherit it). Best effort: without it requests count from the
/// moment their header is read, as before.
pub fn enable(listener: &TcpListener) {
    let flags = TimestampingFlag::SOF_TIMESTAMPING_RX_SOFTWARE
        | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE;
    if let Err(e) = setsockopt(listener, sockopt::Timestamping, &flags) {
        tracing::debug!(error = %e, "data plane: no kernel receive timestamps");
    }
}

/// A data-plane connection's stream.
pub trait FrameStream: AsyncRead + AsyncWrite + Unpin + Send {
    /// Reads one frame header into `raw`; returns when the kernel received
    /// its first byte, where the stream can tell.
    fn read_header<'a>(
        &'a mut self,
        raw: &'a mut [u8; HEADER_LEN],
    ) -> impl Future<Output = io::Result<Option<SystemTime>>> + Send + 'a {
        async move { self.read_exact(raw).await.map(|_| None) }
    }
}

impl FrameStream for tokio_rustls::server::TlsStream<TcpStream> {}
impl FrameStream for tokio::io::DuplexStream {}

impl FrameStream for TcpStream {
    async fn read_header(&mut self, raw: &mut [u8; HEADER_LEN]) -> io::Result<Option<SystemTime>> {
        let (mut got, mut first) = (0, None);
        while got < HEADER_LEN {
            self.readable().await?;
            let r = self.try_io(Interest::READABLE, || recv_stamped(self, &mut raw[got..]));
            match r {
                Ok((0, _)) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok((n, stamp)) => {
                    got += n;
                    first = first.or(stamp);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(first)
    }
}

/// One non-blocking `recvmsg` into `buf`: bytes read and their receive stamp.
fn recv_stamped(sock: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, Option<SystemTime>)> {
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(Timestamps);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let stamp = msg.cmsgs().ok().and_then(|mut c| {
        c.find_map(|c| match c {
            ControlMessageOwned::ScmTimestampsns(t) => Some(t.system),
            _ => None,
        })
    });
    let stamp = stamp
        .filter(|t| t.tv_sec() > 0)
        .map(|t| SystemTime::UNIX_EPOCH + Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32));
    Ok((msg.bytes, stamp))
}

/// How long the bytes stamped `stamp` waited before now, at most `cap` (a
/// wall clock stepped backwards gives zero, one stepped forwards `cap`).
pub fn waited(stamp: Option<SystemTime>, cap: Duration) -> Duration {
    stamp
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .unwrap_or_default()
        .min(cap)
}
