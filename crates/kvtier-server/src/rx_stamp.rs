//! When a request really arrived: the kernel's receive timestamp of its
//! bytes (`SO_TIMESTAMPING`, software RX stamps).
//!
//! A request that waits in its socket's receive queue because the server is
//! busy is queued as surely as one waiting for admission, but the server only
//! sees it once it reads it. On plain TCP connections reads use `recvmsg`,
//! which also returns the time the kernel received the bytes, so that wait
//! counts as queue time (`ServerTiming.queue_us`, the request metrics) and
//! the request's deadlines start from its arrival (notes/028 found the
//! queue forms there):
//! - the data plane reads each frame header this way ([`FrameStream`]);
//! - gRPC connections ([`crate::limits::Capped`]) read the first 4 KiB of
//!   every read this way and keep the stamp of their last read for
//!   [`crate::grpc::late`] (none when more than those 4 KiB were waiting).
//!
//! TLS on the data plane and in-memory streams report no stamp and keep the
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

    /// The same-host front's shared memory, on that front only
    /// (docs/local.md): MapRead, Release, Lend and WriteLent are served
    /// where it is `Some`.
    fn shm(&self) -> Option<std::sync::Arc<crate::shm::Shm>> {
        None
    }

    /// Sends as much of `bytes` as the socket takes now or after waiting
    /// for room, with `fds` attached to the first byte (`SCM_RIGHTS`).
    /// Only the same-host socket can.
    fn send_fds<'a>(
        &'a mut self,
        bytes: &'a [u8],
        fds: &'a [std::os::fd::BorrowedFd<'a>],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        let _ = (bytes, fds);
        async { Err(io::ErrorKind::Unsupported.into()) }
    }
}

impl FrameStream for tokio_rustls::server::TlsStream<TcpStream> {}
impl FrameStream for tokio::io::DuplexStream {}

impl FrameStream for TcpStream {
    async fn read_header(&mut self, raw: &mut [u8; HEADER_LEN]) -> io::Result<Option<SystemTime>> {
        let mut buf = tokio::io::ReadBuf::new(raw);
        let mut first = None;
        while buf.remaining() > 0 {
            let before = buf.filled().len();
            let stamp = std::future::poll_fn(|cx| poll_read_stamped(self, cx, &mut buf)).await?;
            if buf.filled().len() == before {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            first = first.or(stamp);
        }
        Ok(first)
    }
}

/// Bytes read with `recvmsg` (and so with a receive stamp) at the start of
/// a [`poll_read_stamped`]; the rest of that read is a plain one. Small,
/// because safe code must zero what `recvmsg` reads into.
const STAMPED_READ: usize = 4096;

/// `AsyncRead::poll_read` for a plain TCP stream that also returns the
/// kernel's receive stamp of what it read (where there is one). The first
/// [`STAMPED_READ`] bytes are read with `recvmsg` (for TCP the kernel stamps a
/// read with its last segment's arrival); if that was all there was, the
/// stamp is returned: every byte read waited at least that long. If more
/// followed, read plainly (safe code would have to zero a large buffer for
/// every `recvmsg`), no stamp is returned, since those later bytes may have
/// waited less.
pub fn poll_read_stamped(
    sock: &mut TcpStream,
    cx: &mut std::task::Context<'_>,
    buf: &mut tokio::io::ReadBuf<'_>,
) -> std::task::Poll<io::Result<Option<SystemTime>>> {
    use std::task::Poll;
    if buf.remaining() == 0 {
        return Poll::Ready(Ok(None));
    }
    let first = buf.remaining().min(STAMPED_READ);
    let stamp = loop {
        match sock.poll_read_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {}
        }
        let s: &TcpStream = sock;
        let dst = buf.initialize_unfilled_to(first);
        match s.try_io(Interest::READABLE, || recv_stamped(s, dst)) {
            Ok((n, stamp)) => {
                buf.advance(n);
                if n < first {
                    return Poll::Ready(Ok(stamp)); // all there was (or EOF)
                }
                break stamp;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
    };
    // More may be waiting: the rest of the buffer with a plain read. Nothing
    // more now is fine. An error is returned now, and the bytes read before
    // it are dropped (callers take a read's bytes only on success): the
    // kernel reports a socket error once (a later read would see an end of
    // stream, not a reset), and a connection in error can carry no reply to
    // them anyway.
    let before = buf.filled().len();
    if buf.remaining() > 0
        && let Poll::Ready(Err(e)) = std::pin::Pin::new(sock).poll_read(cx, buf)
        && e.kind() != io::ErrorKind::Interrupted
    {
        return Poll::Ready(Err(e));
    }
    // Bytes that came with the plain read arrived after the stamped ones, at
    // a time not known: the read reports no stamp rather than one that
    // would overstate their wait.
    Poll::Ready(Ok(stamp.filter(|_| buf.filled().len() == before)))
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

/// Waits (up to `within`) until the kernel stamps what loopback sockets
/// receive, by sending a byte between two sockets of its own and reading it
/// back until a stamp comes with it. The kernel turns stamping on for the
/// whole system in deferred work after the first socket asks for it, so
/// packets received in the first moments after a server starts may carry
/// none (their wait then counts from when they were read). Tests that time
/// a socket wait call this first; `false` means no stamps on this kernel.
pub async fn kernel_stamps_on(within: Duration) -> bool {
    use tokio::io::AsyncWriteExt;
    let until = tokio::time::Instant::now() + within;
    let Ok(listener) = TcpListener::bind("127.0.0.1:0").await else {
        return false;
    };
    enable(&listener);
    let Ok(addr) = listener.local_addr() else {
        return false;
    };
    let (Ok(mut tx), Ok((mut rx, _))) = tokio::join!(TcpStream::connect(addr), listener.accept())
    else {
        return false;
    };
    while tokio::time::Instant::now() < until {
        let mut b = [0u8; HEADER_LEN];
        if tx.write_all(&b).await.is_err() {
            return false;
        }
        match rx.read_header(&mut b).await {
            Ok(Some(_)) => return true,
            Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(_) => return false,
        }
    }
    false
}
