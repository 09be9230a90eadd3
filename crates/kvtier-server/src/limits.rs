//! Limits every front shares (docs/operations.md): the bytes of requests held
//! in memory while they arrive, open connections, and how long a connection
//! may idle or a request may take to arrive.
//!
//! Why: bytes still arriving count against no other budget. Without this, 16
//! data-plane connections each sending most of a 251 MiB Write and stalling
//! held 4 GiB against a 512 MiB memory tier (issue 18); idle connections were
//! never closed, so enough of them exhausted the file descriptors.
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

mod charged;
pub mod refused;
mod reply;
use charged::{CLIENT_STREAMING, ChargedBody};
use reply::InUseBody;

/// Most reads, across the server, that requests ended early (a data-plane
/// reply that filled up) may leave running in the background so that what
/// they fetch is promoted: four requests' worth at the default object-store
/// read-ahead of 16.
pub const HANDOFF_READS: usize = 64;

/// The shared limits of one server.
#[derive(Clone)]
pub struct Limits {
    memory: Arc<Semaphore>,
    /// Reads a finished request left in flight and handed to the background
    /// (`PrefixReader::put_back`), across the server.
    handoff: Arc<Semaphore>,
    /// `server.request_memory` in bytes.
    pub memory_bytes: u64,
    /// `server.max_connections`, per data-plane listener.
    pub max_connections: usize,
    /// `server.idle_timeout`.
    pub idle_timeout: Duration,
    /// `server.read_timeout`.
    pub read_timeout: Duration,
}

/// Bytes of a request being held; released when dropped.
pub struct Reservation {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Reservation {
    fn bytes(&self) -> u64 {
        self._permit.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// Gives back `n` of its bytes (all of them when it holds fewer).
    fn release(&mut self, n: u64) {
        if let Some(p) = self._permit.as_mut() {
            if n >= p.num_permits() as u64 {
                self._permit = None;
            } else {
                drop(p.split(n as usize));
            }
        }
    }
}

/// Gives back the first `n` bytes `held` (oldest first).
fn release(held: &Held, mut n: u64) {
    let mut h = held.lock();
    for r in h.iter_mut() {
        if n == 0 {
            break;
        }
        let k = r.bytes().min(n);
        r.release(k);
        n -= k;
    }
    h.retain(|r| r.bytes() > 0);
}

impl Limits {
    /// Limits with `memory_bytes` for requests in flight.
    pub fn new(memory_bytes: u64, max_connections: usize, idle: Duration, read: Duration) -> Self {
        // Permits are bytes; tokio caps a semaphore at usize::MAX >> 3.
        let permits = memory_bytes.min((usize::MAX >> 3) as u64) as usize;
        Self {
            memory: Arc::new(Semaphore::new(permits)),
            handoff: Arc::new(Semaphore::new(HANDOFF_READS)),
            memory_bytes,
            max_connections: max_connections.max(1),
            idle_timeout: idle,
            read_timeout: read,
        }
    }

    /// Room for `n` reads handed to the background, or `None` when
    /// [`HANDOFF_READS`] are already there (the reads are then dropped).
    pub fn try_handoff(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n).ok()?;
        self.handoff.clone().try_acquire_many_owned(n).ok()
    }

    /// Limits that never refuse (tests, embedding).
    pub fn unlimited() -> Self {
        Self::new(
            u64::MAX >> 4,
            usize::MAX >> 4,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        )
    }

    /// Takes `bytes` from the request budget now, or refuses with
    /// RESOURCE_EXHAUSTED (never waits: a client told to retry beats one
    /// whose upload sits half-received holding memory).
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, tonic::Status> {
        if bytes == 0 {
            return Ok(Reservation { _permit: None });
        }
        if bytes > self.memory_bytes || bytes > u32::MAX as u64 {
            return Err(tonic::Status::resource_exhausted(format!(
                "a request of {bytes} bytes is larger than the server's request memory ({} bytes, server.request_memory)",
                self.memory_bytes
            )));
        }
        match self.memory.clone().try_acquire_many_owned(bytes as u32) {
            Ok(p) => Ok(Reservation { _permit: Some(p) }),
            Err(_) => Err(tonic::Status::resource_exhausted(format!(
                "server busy: {} of {} bytes of request memory (server.request_memory) in use; retry with back-off",
                self.in_use(),
                self.memory_bytes
            ))),
        }
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> u64 {
        let free = self.memory.available_permits() as u64;
        self.memory_bytes
            .min((usize::MAX >> 3) as u64)
            .saturating_sub(free)
    }
}

/// Tower layer for the gRPC server: every request body's bytes are charged to
/// the request memory as its HTTP/2 frames arrive, and held until the
/// response is ready (a unary handler keeps the decoded message that long);
/// a stream of messages (`WriteStream`, kvstore `StreamingRead`) gives each
/// message's bytes back once it was handled and the server asks for more.
/// A frame that does not fit fails the request with RESOURCE_EXHAUSTED, the
/// rest of its body unread. A body must also keep arriving: a unary
/// `kvtier.v1` or `kvstore` call's whole body within `server.read_timeout` of
/// its start; any other call (client streaming, bidirectional, reflection)
/// must not keep the server waiting for its next bytes longer than that
/// (time the server spends answering, before it asks for more, does not
/// count). Past it the request fails with DEADLINE_EXCEEDED and what it held
/// is given back (a client that announces a large upload and stalls holds
/// its bytes no longer). A response body the client takes nothing of for
/// `server.idle_timeout` is dropped, with what it holds (see
/// [`reply::InUseBody`]).
#[derive(Clone)]
pub struct ChargeLayer(pub Limits);

impl<S> tower::Layer<S> for ChargeLayer {
    type Service = ChargeService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ChargeService {
            inner,
            limits: self.0.clone(),
        }
    }
}

/// See [`ChargeLayer`].
#[derive(Clone)]
pub struct ChargeService<S> {
    inner: S,
    limits: Limits,
}

type Held = Arc<parking_lot::Mutex<Vec<Reservation>>>;

impl<S, B> tower::Service<http::Request<B>> for ChargeService<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The connection is in use until the response's body has been sent
        // (a streamed Read is served while its body goes out).
        let in_use = activity_of(req.extensions()).map(|a| a.start());
        let held: Held = Default::default();
        let limits = self.limits.clone();
        let h = held.clone();
        let path = req.uri().path();
        let whole_body = (path.starts_with("/kvtier.v1.KvTier/")
            || path.starts_with("/kvstore.KVStoreService/"))
            && !CLIENT_STREAMING.contains(&path);
        // A stream of messages is charged for the messages it holds, not all it sent.
        let per_message = CLIENT_STREAMING.contains(&path);
        let factor = charged::charge_factor(path);
        let req = req.map(move |b| {
            tonic::body::Body::new(ChargedBody {
                inner: Box::pin(b),
                limits,
                held: h,
                factor,
                stall: None,
                start: tokio::time::Instant::now(),
                whole_body,
                waiting: whole_body,
                framing: per_message.then(Default::default),
            })
        });
        let idle = self.limits.idle_timeout;
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(held);
            r.map(|resp| {
                resp.map(|inner| tonic::body::Body::new(InUseBody::new(inner, in_use, idle)))
            })
        })
    }
}

/// Requests in service on one gRPC connection, and when the last one ended:
/// what "idle" means for `server.idle_timeout` (HTTP/2 pings are traffic, not
/// use).
pub struct Activity {
    active: AtomicUsize,
    /// When the connection was last in use (ms since `epoch`).
    last_ms: AtomicU64,
    /// When the server last wrote to it (ms since `epoch`): a reply body
    /// still being sent after its request ended (shutdown drain only).
    wrote_ms: AtomicU64,
    /// The kernel's receive stamp of the newest bytes read (ns since the
    /// Unix epoch; 0: none), for queue time spent in the socket.
    rx_ns: AtomicU64,
    epoch: Instant,
}

impl Activity {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            wrote_ms: AtomicU64::new(0),
            rx_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A request started; it ends when the guard drops.
    pub fn start(self: &Arc<Self>) -> InUse {
        self.active.fetch_add(1, Ordering::AcqRel);
        InUse(self.clone())
    }

    /// How long the connection has been idle (zero while a request is served).
    pub fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        let last = self.last_ms.load(Ordering::Acquire);
        Duration::from_millis(self.now_ms().saturating_sub(last))
    }

    /// When the kernel received the newest bytes read from the connection,
    /// where the socket reports it (plain TCP, RX timestamps on).
    pub fn last_rx(&self) -> Option<std::time::SystemTime> {
        let ns = self.rx_ns.load(Ordering::Acquire);
        (ns > 0).then(|| std::time::SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
    }

    /// A read's stamp; a read without one clears it, so a wait is never
    /// measured from older bytes than the newest read.
    fn received(&self, stamp: Option<std::time::SystemTime>) {
        let ns = stamp
            .and_then(|t| t.duration_since(std::time::SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        self.rx_ns.store(ns, Ordering::Release);
    }

    /// Like [`Activity::idle_for`], also counting writes as use.
    fn quiet_for(&self) -> Duration {
        let wrote = self.wrote_ms.load(Ordering::Acquire);
        let since_write = Duration::from_millis(self.now_ms().saturating_sub(wrote));
        self.idle_for().min(since_write)
    }
}

/// A request in service on a connection (see [`Activity`]).
pub struct InUse(Arc<Activity>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.last_ms.store(self.0.now_ms(), Ordering::Release);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

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
    _slot: OwnedSemaphorePermit,
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
        slot: OwnedSemaphorePermit,
        idle: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let activity = Arc::new(Activity::new());
        Self {
            io,
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
        a.wrote_ms.store(a.now_ms(), Ordering::Release);
    }

    /// Whether the connection has been unused past its timeout (the idle
    /// timeout, or [`DRAIN_IDLE`] once the server is shutting down); if not,
    /// `cx` is woken when it next may be. Checked whenever a read or a write
    /// would wait: HTTP/2 does not read while its writes are blocked, so a
    /// client that stops reading would otherwise hold its connection (and a
    /// shutdown) however long it likes.
    fn poll_expired(&mut self, cx: &mut std::task::Context<'_>, writing: bool) -> bool {
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

/// The connection's activity, from a request's extensions (plain or TLS).
pub fn activity_of(ext: &http::Extensions) -> Option<Arc<Activity>> {
    use tonic::transport::server::TlsConnectInfo;
    ext.get::<ConnInfo>()
        .or_else(|| ext.get::<TlsConnectInfo<ConnInfo>>().map(|t| t.get_ref()))
        .map(|c| c.activity.clone())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamed reply (a Read) is served while its body goes out: the
    /// connection must count as in use until the body is done, or the idle
    /// timeout and the shutdown drain could close it mid-reply.
    #[tokio::test]
    async fn a_connection_stays_in_use_until_its_reply_body_is_done() {
        use tower::{Layer, Service, ServiceExt};
        let activity = Arc::new(Activity::new());
        /// A reply body still being produced (as a streamed Read's is).
        struct Streaming;
        impl http_body::Body for Streaming {
            type Data = bytes::Bytes;
            type Error = tonic::Status;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>>
            {
                std::task::Poll::Pending
            }
        }
        let inner = tower::service_fn(|_req: http::Request<tonic::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::new(
                Streaming,
            )))
        });
        let mut charged = ChargeLayer(Limits::unlimited()).layer(inner);
        let mut req = http::Request::new(tonic::body::Body::empty());
        req.extensions_mut().insert(ConnInfo {
            tcp: tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: None,
            },
            activity: activity.clone(),
        });
        let reply = ServiceExt::<http::Request<tonic::body::Body>>::ready(&mut charged)
            .await
            .unwrap()
            .call(req)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(
            activity.idle_for(),
            Duration::ZERO,
            "reply body not sent yet"
        );
        drop(reply);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(activity.idle_for() >= Duration::from_millis(20));
    }

    /// A client that stops reading blocks the server's writes, and HTTP/2
    /// does not read while its writes are blocked: the idle timeout and the
    /// shutdown drain are also checked when a write would wait, or such a
    /// client holds its connection slot, and a shutdown, as long as it likes.
    #[tokio::test]
    async fn a_connection_whose_client_stopped_reading_is_closed_when_idle() {
        use tokio::io::AsyncWriteExt;
        for shutting_down in [false, true] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            let _client = sock.connect(listener.local_addr().unwrap()).await.unwrap();
            let (io, _) = listener.accept().await.unwrap();
            socket2::SockRef::from(&io)
                .set_send_buffer_size(4096)
                .unwrap();
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let slot = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
            let (idle, at_least) = if shutting_down {
                (Duration::from_secs(3600), DRAIN_IDLE)
            } else {
                (Duration::from_millis(300), Duration::from_millis(300))
            };
            let started = Instant::now();
            let mut conn = Capped::new(io, slot, idle, stop_rx);
            if shutting_down {
                stop_tx.send(true).unwrap();
            }
            let chunk = vec![0u8; 1 << 20];
            let wrote = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    conn.write_all(&chunk).await?;
                }
            })
            .await;
            let err: std::io::Result<()> =
                wrote.expect("a write to a client that stopped reading waited for ever");
            assert_eq!(
                err.unwrap_err().kind(),
                std::io::ErrorKind::TimedOut,
                "shutting down: {shutting_down}"
            );
            assert!(started.elapsed() >= at_least, "closed before its time");
        }
    }

    /// A streaming call's body is only late while the server waits for it:
    /// time the server spends answering, before it asks for the next
    /// message, does not count (a kvstore StreamingRead client sends its
    /// next request once it has the previous answer). A wait past
    /// `read_timeout` still fails.
    #[tokio::test]
    async fn a_streaming_body_is_late_only_while_the_server_waits_for_it() {
        use tower::{Layer, Service, ServiceExt};
        /// A request body fed by the test.
        struct Fed(tokio::sync::mpsc::Receiver<bytes::Bytes>);
        impl http_body::Body for Fed {
            type Data = bytes::Bytes;
            type Error = tonic::Status;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>>
            {
                self.0
                    .poll_recv(cx)
                    .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
            }
        }
        let read_timeout = Duration::from_millis(200);
        for (answering, waiting, late) in [(600, 50, false), (0, 400, true)] {
            // The service: reads a message, answers for `answering` ms, reads the next.
            let inner =
                tower::service_fn(move |req: http::Request<tonic::body::Body>| async move {
                    let mut body = req.into_body();
                    let mut next = async || {
                        std::future::poll_fn(|cx| {
                            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
                        })
                        .await
                    };
                    assert!(matches!(next().await, Some(Ok(_))), "the first message");
                    tokio::time::sleep(Duration::from_millis(answering)).await;
                    let second = match next().await {
                        Some(Ok(_)) => "ok".to_string(),
                        Some(Err(e)) => e.to_string(),
                        None => "ended".to_string(),
                    };
                    Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::new(
                        second,
                    )))
                });
            let limits = Limits::new(1 << 20, 10, Duration::from_secs(3600), read_timeout);
            let mut charged = ChargeLayer(limits).layer(inner);
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let mut req = http::Request::new(tonic::body::Body::new(Fed(rx)));
            *req.uri_mut() = "/kvstore.KVStoreService/StreamingRead".parse().unwrap();
            tx.send(bytes::Bytes::from_static(b"one")).await.unwrap();
            let feeder = tokio::spawn(async move {
                // The next message comes `waiting` ms after the server asked for it.
                tokio::time::sleep(Duration::from_millis(answering + waiting)).await;
                let _ = tx.send(bytes::Bytes::from_static(b"two")).await;
                tx // the body stays open
            });
            let reply = ServiceExt::<http::Request<tonic::body::Body>>::ready(&mut charged)
                .await
                .unwrap()
                .call(req)
                .await
                .unwrap();
            let mut body = reply.into_body();
            let frame = std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
            })
            .await
            .unwrap()
            .unwrap();
            let second = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
            if late {
                assert!(
                    second.contains("read_timeout"),
                    "a {waiting} ms wait: {second}"
                );
            } else {
                assert_eq!(
                    second, "ok",
                    "{answering} ms answering, then {waiting} ms waiting"
                );
            }
            drop(feeder.await);
        }
    }

    #[test]
    fn reservations_are_bounded_and_released() {
        let l = Limits::new(1000, 10, Duration::from_secs(1), Duration::from_secs(1));
        let a = l.reserve(600).unwrap();
        assert_eq!(l.in_use(), 600);
        let e = l.reserve(600).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("retry"), "{e:?}");
        drop(a);
        assert_eq!(l.in_use(), 0);
        let _b = l.reserve(600).unwrap();
        assert!(
            l.reserve(2000)
                .err()
                .unwrap()
                .message()
                .contains("larger than")
        );
        assert!(l.reserve(0).is_ok());
    }
}
