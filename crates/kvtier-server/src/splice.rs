//! Sending a stored block without copying it into the socket (notes/039).
//!
//! A `write()` of a 1.2 MB block makes the kernel copy it into socket
//! buffers: on loopback that copy is most of the sending core's time, and
//! the reader copies the same bytes a second time out of its socket. Here the
//! block's pages are handed to a pipe (`vmsplice`) and moved from the pipe
//! into the socket (`splice`), so the socket's buffers refer to the block's
//! memory and the reader's copy is the only one.
//!
//! The socket may refer to those pages long after the reply was sent (a
//! client that does not read keeps them in its receive queue), so only
//! memory that is never reused as it is may be sent this way:
//! `kvtier_proto::pages` buffers, which are given back to the kernel instead
//! of being reused once they were lent. The caller asks
//! `kvtier_proto::pages::lend` first and writes anything it refuses.
//!
//! Whatever goes wrong with the pipe (no pipe allowed, `vmsplice` refused by
//! a seccomp filter) falls back to a plain write, for that payload or, when
//! the system refuses the calls themselves, for the connection's lifetime.

use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The pipe's capacity asked for (the unprivileged maximum by default,
/// `/proc/sys/fs/pipe-max-size`); one `vmsplice` moves at most this much.
const PIPE_BYTES: i32 = 1 << 20;

static SPLICED: AtomicU64 = AtomicU64::new(0);

/// Bytes this process has sent by splicing since it started (metrics:
/// `kvtier_wire_spliced_bytes_total`).
pub fn spliced_bytes() -> u64 {
    SPLICED.load(Ordering::Relaxed)
}

/// One connection's splicing state: its pipe, created on first use.
#[derive(Default)]
pub struct Splicer {
    pipe: Option<Pipe>,
    /// The system refused a pipe or the calls: write from now on.
    off: bool,
    /// Bytes this splicer moved through its pipe.
    spliced: u64,
}

impl Splicer {
    /// A splicer that always writes (the behaviour without splicing).
    pub fn disabled() -> Self {
        Splicer {
            pipe: None,
            off: true,
            spliced: 0,
        }
    }

    /// Whether this splicer may splice (not disabled, not refused by the system).
    pub fn enabled(&self) -> bool {
        !self.off
    }

    /// Sends `data` on `sock`. `more` says more of the same frame follows,
    /// so the last piece is not pushed on its own. `data` must have been
    /// accepted by `kvtier_proto::pages::lend` (module docs).
    pub async fn send(
        &mut self,
        sock: &mut TcpStream,
        data: &[u8],
        more: bool,
    ) -> std::io::Result<()> {
        if self.off {
            return sock.write_all(data).await;
        }
        if self.pipe.is_none() {
            match Pipe::new() {
                Some(p) => self.pipe = Some(p),
                None => {
                    self.off = true;
                    return sock.write_all(data).await;
                }
            }
        }
        let pipe = self.pipe.as_ref().expect("just made");
        let mut rest = data;
        while !rest.is_empty() {
            let n = match pipe.fill(rest) {
                Ok(n) => n,
                Err(e) => {
                    // The pipe is empty here (every fill is drained below),
                    // so the rest can simply be written.
                    if matches!(
                        e,
                        nix::errno::Errno::ENOSYS
                            | nix::errno::Errno::EPERM
                            | nix::errno::Errno::EINVAL
                    ) {
                        self.off = true;
                    }
                    tracing::debug!(error = %e, "vmsplice refused; writing instead");
                    return sock.write_all(rest).await;
                }
            };
            let mut left = n;
            while left > 0 {
                let push_later = more || rest.len() > n;
                sock.writable().await?;
                match sock.try_io(tokio::io::Interest::WRITABLE, || {
                    pipe.drain_into(sock, left, push_later)
                }) {
                    Ok(k) => left -= k,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    // The pipe may still hold bytes: it goes with the
                    // connection, which the caller drops on any error.
                    Err(e) => {
                        self.pipe = None;
                        return Err(e);
                    }
                }
            }
            SPLICED.fetch_add(n as u64, Ordering::Relaxed);
            self.spliced += n as u64;
            rest = &rest[n..];
        }
        Ok(())
    }
}

#[cfg(target_os = "linux")]
struct Pipe {
    rd: std::os::fd::OwnedFd,
    wr: std::os::fd::OwnedFd,
}

#[cfg(target_os = "linux")]
impl Pipe {
    fn new() -> Option<Pipe> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let (rd, wr) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)
            .inspect_err(|e| tracing::debug!(error = %e, "no pipe for splicing"))
            .ok()?;
        // A smaller pipe still works (more rounds); only a refused pipe is fatal.
        if let Err(e) = fcntl(&wr, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES)) {
            tracing::debug!(error = %e, "pipe stays at its default size");
        }
        Some(Pipe { rd, wr })
    }

    /// Maps as much of `data` as the (empty) pipe holds; returns how much.
    fn fill(&self, data: &[u8]) -> nix::Result<usize> {
        use nix::fcntl::{SpliceFFlags, vmsplice};
        vmsplice(
            &self.wr,
            &[std::io::IoSlice::new(data)],
            SpliceFFlags::SPLICE_F_NONBLOCK,
        )
    }

    /// Moves up to `len` bytes from the pipe into `sock` (non-blocking).
    fn drain_into(&self, sock: &TcpStream, len: usize, more: bool) -> std::io::Result<usize> {
        use nix::fcntl::{SpliceFFlags, splice};
        let mut flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        if more {
            flags |= SpliceFFlags::SPLICE_F_MORE;
        }
        splice(&self.rd, None, sock, None, len, flags).map_err(std::io::Error::from)
    }
}

#[cfg(not(target_os = "linux"))]
struct Pipe;

#[cfg(not(target_os = "linux"))]
impl Pipe {
    fn new() -> Option<Pipe> {
        None
    }
    fn fill(&self, _: &[u8]) -> Result<usize, nix::errno::Errno> {
        Err(nix::errno::Errno::ENOSYS)
    }
    fn drain_into(&self, _: &TcpStream, _: usize, _: bool) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
            .collect()
    }

    /// Payloads larger than the pipe and smaller than it arrive whole and in
    /// order, all through the pipe.
    #[tokio::test]
    async fn spliced_payloads_arrive_intact_and_in_order() {
        let (mut tx, mut rx) = pair().await;
        let sizes = [3 * 1024 * 1024 + 17, 1_258_291, 1000, 64 * 1024];
        let bufs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, i as u8))
            .collect();
        let total: usize = sizes.iter().sum();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; total];
            rx.read_exact(&mut got).await.unwrap();
            got
        });
        let mut sp = Splicer::default();
        for (i, b) in bufs.iter().enumerate() {
            sp.send(&mut tx, b, i + 1 < bufs.len()).await.unwrap();
        }
        let got = reader.await.unwrap();
        assert!(
            got == bufs.concat(),
            "the bytes received differ from those sent"
        );
        assert_eq!(sp.spliced, total as u64, "what went through the pipe");
    }

    /// A receiver that does not read makes the socket refuse more (EAGAIN):
    /// the sender waits for it, neither failing nor finishing early, and
    /// every byte arrives once the reader reads.
    #[tokio::test]
    async fn a_full_socket_waits_for_the_reader() {
        let (mut tx, mut rx) = pair().await;
        // A small receive buffer (no autotuning) so 16 MB cannot be queued.
        socket2::SockRef::from(&rx)
            .set_recv_buffer_size(64 * 1024)
            .unwrap();
        let data = pattern(16 * 1024 * 1024, 7);
        let want = data.clone();
        let send = tokio::spawn(async move {
            let mut sp = Splicer::default();
            sp.send(&mut tx, &data, false).await.unwrap();
            (tx, sp.spliced)
        });
        let mut first = vec![0u8; 64 * 1024];
        while rx.peek(&mut first).await.unwrap() < 32 * 1024 {
            tokio::task::yield_now().await;
        }
        assert!(!send.is_finished(), "16 MB fit in a 64 KiB receive buffer?");
        let mut got = vec![0u8; want.len()];
        rx.read_exact(&mut got).await.unwrap();
        let (_tx, spliced) = send.await.unwrap();
        assert!(got == want, "the bytes received differ from those sent");
        assert_eq!(spliced, want.len() as u64);
    }

    /// A disabled splicer writes, and the bytes arrive the same.
    #[tokio::test]
    async fn a_disabled_splicer_writes() {
        let (mut tx, mut rx) = pair().await;
        let data = pattern(2 * 1024 * 1024, 3);
        let want = data.clone();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; want.len()];
            rx.read_exact(&mut got).await.unwrap();
            got == want
        });
        let mut sp = Splicer::disabled();
        sp.send(&mut tx, &data, false).await.unwrap();
        assert!(reader.await.unwrap());
        assert_eq!(sp.spliced, 0);
    }
}
