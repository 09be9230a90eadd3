//! A gRPC connection holding one of `server.max_connections` slots, closed
//! when idle (see [`Capped`]).
use super::Activity;
use super::Slot;
use std::sync::Arc;
use std::time::Duration;

/// What a gRPC request learns of its connection (request extensions).
#[derive(Clone)]
pub struct ConnInfo {
    /// Addresses, as tonic reports them for plain TCP.
    pub tcp: tonic::transport::server::TcpConnectInfo,
    /// The connection's use, for the idle timeout.
    pub activity: Arc<Activity>,
}

/// A gRPC connection holding one of `server.max_connections` slots, closed
/// once no request has been in service on it for `server.idle_timeout`.
pub struct Capped {
    io: tokio::net::TcpStream,
    _slot: Slot,
    /// Resolves when the listener gave the slot to a newer connection.
    evicted: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    activity: Arc<Activity>,
    idle: Duration,
    check: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Resolves when the server shuts down (then `None`, and `idle` is
    /// [`DRAIN_IDLE`]).
    stop: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// When bytes were last read (see [`READ_SETTLE`]).
    last_read: tokio::time::Instant,
}

/// How long after a read a connection is never closed as idle: what was
/// read may be a request HTTP/2 has not yet handed to its service.
const READ_SETTLE: Duration = Duration::from_millis(50);

/// How long a connection must be quiet (no request in service, nothing
/// written) before a shutting-down server closes it. HTTP/2's graceful close
/// waits for the client to answer a PING after GOAWAY; a client that is not
/// reading its socket never does, and would hold the shutdown for the whole
/// `server.shutdown_grace`.
pub const DRAIN_IDLE: Duration = Duration::from_millis(200);

impl Capped {
    /// Wraps an accepted connection; `stop` flips when the server shuts down.
    pub fn new(
        io: tokio::net::TcpStream,
        slot: Slot,
        idle: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let activity = Arc::new(Activity::new(slot.busy_counter()));
        Self {
            io,
            evicted: Box::pin(slot.evicted()),
            _slot: slot,
            activity,
            idle,
            check: Box::pin(tokio::time::sleep(idle)),
            last_read: tokio::time::Instant::now(),
            stop: Some(Box::pin(async move {
                let _ = stop.wait_for(|s| *s).await;
            })),
        }
    }

    /// The server writes to the connection (a reply body is still going out).
    fn wrote(&self) {
        let a = &self.activity;
        a.wrote();
    }

    /// Whether the connection has been unused past its timeout (the idle
    /// timeout, or [`DRAIN_IDLE`] once the server is shutting down); if not,
    /// `cx` is woken when it next may be. Checked whenever a read or a write
    /// would wait: HTTP/2 does not read while its writes are blocked, so a
    /// client that stops reading would otherwise hold its connection (and a
    /// shutdown) however long it likes.
    fn poll_expired(&mut self, cx: &mut std::task::Context<'_>, writing: bool) -> bool {
        // A full listener gave this idle connection's slot to a newer one.
        if self.evicted.as_mut().poll(cx).is_ready() {
            tracing::debug!("gRPC: idle connection closed for a new one (server.max_connections)");
            return true;
        }
        // Shutting down: from now on a connection quiet for DRAIN_IDLE is closed.
        if let Some(stop) = self.stop.as_mut()
            && stop.as_mut().poll(cx).is_ready()
        {
            self.stop = None;
            self.idle = DRAIN_IDLE;
            self.check.as_mut().reset(tokio::time::Instant::now());
        }
        while self.check.as_mut().poll(cx).is_ready() {
            // Bytes just read may be a request HTTP/2 has not handed to its
            // service yet (nothing marks the connection in use before that):
            // never close right after a read.
            // A write waiting on the client: only a client that stopped
            // reading is idle, not a slow one still taking a long reply.
            let idle = if writing {
                self.activity.quiet_for()
            } else {
                self.unused_for()
            };
            let settled = self.last_read.elapsed() >= READ_SETTLE;
            if idle >= self.idle && settled {
                tracing::debug!(
                    ?idle,
                    "gRPC: idle connection closed (server.idle_timeout, or shutting down)"
                );
                return true;
            }
            let left = if settled {
                self.idle.saturating_sub(idle)
            } else {
                READ_SETTLE
            };
            let next = tokio::time::Instant::now() + left.max(Duration::from_millis(1));
            self.check.as_mut().reset(next);
        }
        false
    }

    /// A write that would wait: an error once the connection is past its
    /// idle time (the peer stopped reading), so HTTP/2 drops it.
    fn write_pending<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::task::Poll;
        match polled {
            Poll::Pending if self.poll_expired(cx, true) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "idle connection closed: the client stopped reading",
            ))),
            other => other,
        }
    }

    /// A write's outcome: bytes written count as use (shutdown drain).
    fn written(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<usize>>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let std::task::Poll::Ready(Ok(n)) = polled
            && n > 0
        {
            self.wrote();
        }
        self.write_pending(cx, polled)
    }

    /// How long this connection has gone without use, as its current
    /// timeout counts it.
    fn unused_for(&self) -> Duration {
        match self.stop {
            Some(_) => self.activity.idle_for(),
            None => self.activity.quiet_for(),
        }
    }
}

impl tonic::transport::server::Connected for Capped {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            tcp: self.io.connect_info(),
            activity: self.activity.clone(),
        }
    }
}

impl tokio::io::AsyncRead for Capped {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = &mut *self;
        // Read with the kernel's receive stamp: a request's wait in the socket
        // is queue time (crate::grpc::late).
        match crate::rx_stamp::poll_read_stamped(&mut this.io, cx, buf) {
            Poll::Pending => {}
            Poll::Ready(Ok(stamp)) => {
                this.activity.received(stamp);
                this.last_read = tokio::time::Instant::now();
                return Poll::Ready(Ok(()));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
        }
        // Nothing to read: is the connection past its idle time?
        if this.poll_expired(cx, false) {
            // End of stream: the HTTP/2 connection ends.
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        self.written(cx, polled)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.written(cx, polled)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_flush(cx);
        self.write_pending(cx, polled)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
