//! The same-host front (docs/local.md): one Unix socket that serves both
//! gRPC and the data plane to engines on this machine, where Read and Write
//! payloads move through shared memory (`crate::shm`, the data plane's
//! `wire::shared_memory`) instead of through the socket.
//!
//! Each connection says what it is by its first bytes: a data-plane frame
//! starts with the magic `KVW1`, anything else is handed to the gRPC server
//! (HTTP/2's preface). The socket file is made with the configured mode and
//! owner before it becomes visible (bound under a temporary name, then
//! renamed), so no client can connect through looser permissions.
use crate::GrpcRouter;
use crate::config::SameHostSocket;
use crate::rx_stamp::FrameStream;
use crate::state::Shared;
use anyhow::Context as _;
use kvtier_proto::wire::MAGIC;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};

/// A data-plane connection on the same-host socket: the stream and the
/// process at its other end, pinned at accept (or why it could not be).
pub struct SameHostConn {
    sock: UnixStream,
    shm: std::sync::Arc<crate::shm::Shm>,
}

impl FrameStream for SameHostConn {
    fn shm(&self) -> Option<std::sync::Arc<crate::shm::Shm>> {
        Some(self.shm.clone())
    }

    async fn send_fds(
        &mut self,
        bytes: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        loop {
            self.sock.writable().await?;
            let sent = self.sock.try_io(tokio::io::Interest::WRITABLE, || {
                kvtier_shm::fdpass::send(self.sock.as_fd(), &[std::io::IoSlice::new(bytes)], fds)
            });
            match sent {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

impl AsyncRead for SameHostConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_read(cx, buf)
    }
}

impl AsyncWrite for SameHostConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().sock).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().sock).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.sock.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_shutdown(cx)
    }
}

/// The bound socket; its file is removed when this is dropped (if it is
/// still the one this server made).
pub struct Bound {
    listener: UnixListener,
    path: std::path::PathBuf,
    ino: u64,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds `spec.path` with its mode and owner. A socket file left by a server
/// that is gone is replaced; one another process still listens on, or a
/// file that is not a socket, is an error naming it.
pub fn bind(spec: &SameHostSocket) -> anyhow::Result<Bound> {
    let path = &spec.path;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(
            m.file_type().is_socket(),
            "server.local_listen {}: the path exists and is not a socket",
            path.display()
        );
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "server.local_listen {}: another process listens on this socket",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let tmp = temp_name(path);
    let _ = std::fs::remove_file(&tmp);
    let std_listener = std::os::unix::net::UnixListener::bind(&tmp)
        .with_context(|| format!("cannot listen on {}", tmp.display()))?;
    let made = (|| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(spec.mode))?;
        if let Some((uid, gid)) = spec.owner {
            std::os::unix::fs::chown(&tmp, Some(uid), gid)?;
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| {
            format!(
                "server.local_listen {}: setting mode {:o} / owner {:?}",
                path.display(),
                spec.mode,
                spec.owner
            )
        });
    }
    std_listener.set_nonblocking(true)?;
    let ino = std::fs::metadata(path)?.ino();
    Ok(Bound {
        listener: UnixListener::from_std(std_listener)?,
        path: path.clone(),
        ino,
    })
}

fn temp_name(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// Accepts connections until `stop` flips, handing data-plane ones to
/// [`crate::wire::connection`] and the rest to `router`'s gRPC server.
pub async fn serve(
    bound: Bound,
    router: GrpcRouter,
    shared: Shared,
    max_frame: u64,
    shm: std::sync::Arc<crate::shm::Shm>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (grpc_tx, grpc_rx) = mpsc::channel::<std::io::Result<UnixStream>>(64);
    let mut grpc_stop = stop.clone();
    let grpc = tokio::spawn(router.serve_with_incoming_shutdown(
        tokio_stream::wrappers::ReceiverStream::new(grpc_rx),
        async move {
            let _ = grpc_stop.wait_for(|s| *s).await;
        },
    ));
    let conns = shared.limits.conns(0);
    let mut stopping = stop.clone();
    loop {
        tokio::select! {
            r = bound.listener.accept() => {
                let sock = match r {
                    Ok((s, _)) => s,
                    Err(e) => { tracing::warn!(error = %e, "same-host socket: accept failed"); continue; }
                };
                // Not counted per client: every peer here is this host.
                let slot = match conns.admit(None) {
                    Ok(slot) => slot,
                    Err(full) => {
                        tracing::debug!("same-host socket: connection closed at accept: {full}");
                        continue;
                    }
                };
                let (shared, stop, grpc_tx) = (shared.clone(), stop.clone(), grpc_tx.clone());
                let shm = shm.clone();
                tokio::spawn(async move {
                    let wait = shared.limits.read_timeout;
                    match tokio::time::timeout(wait, is_data_plane(&sock)).await {
                        Ok(Ok(true)) => {
                            let conn = SameHostConn { sock, shm: shm.clone() };
                            if let Err(e) = crate::wire::connection(conn, shared, max_frame, stop, slot).await {
                                tracing::debug!(error = %e, "same-host data-plane connection closed");
                            }
                        }
                        // gRPC holds its connections itself (the slot is for the sniffing).
                        Ok(Ok(false)) => { drop(slot); let _ = grpc_tx.send(Ok(sock)).await; }
                        Ok(Err(_)) | Err(_) => {}
                    }
                });
            }
            _ = stopping.wait_for(|s| *s) => break,
        }
    }
    drop(grpc_tx);
    grpc.await?.context("gRPC on the same-host socket")?;
    Ok(())
}

/// Whether the connection's first bytes are a data-plane frame's magic
/// (peeked: they stay in the socket for whoever serves it).
async fn is_data_plane(sock: &UnixStream) -> std::io::Result<bool> {
    let mut buf = [0u8; 4];
    loop {
        sock.readable().await?;
        match sock.try_io(tokio::io::Interest::READABLE, || peek(sock, &mut buf)) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) if n < buf.len() && buf[..n] == MAGIC[..n] => {
                // A partial magic: wait for the rest (bounded by the caller).
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            Ok(n) => return Ok(buf[..n] == MAGIC[..n] && n == buf.len()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

fn peek(sock: &UnixStream, buf: &mut [u8]) -> std::io::Result<usize> {
    use nix::sys::socket::{MsgFlags, recv};
    use std::os::fd::AsRawFd;
    recv(sock.as_raw_fd(), buf, MsgFlags::MSG_PEEK).map_err(std::io::Error::from)
}
