//! Limits every front shares (docs/operations.md): the bytes of requests held
//! in memory while they arrive, open connections, and how long a connection
//! may idle or a request may take to arrive.
//!
//! Why: bytes still arriving count against no other budget. Without this, 16
//! data-plane connections each sending most of a 251 MiB Write and stalling
//! held 4 GiB against a 512 MiB memory tier (issue 18); idle connections were
//! never closed, so enough of them exhausted the file descriptors.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The shared limits of one server.
#[derive(Clone)]
pub struct Limits {
    memory: Arc<Semaphore>,
    /// `server.request_memory` in bytes.
    pub memory_bytes: u64,
    /// `server.max_connections`, per data-plane listener.
    pub max_connections: usize,
    /// `server.idle_timeout`.
    pub idle_timeout: Duration,
    /// `server.read_timeout`.
    pub read_timeout: Duration,
    /// `server.max_queued`: requests that may wait for admission at once.
    pub max_queued: usize,
    /// `server.queue_timeout`: the longest a request waits for admission.
    pub queue_timeout: Duration,
    waiting: Arc<AtomicUsize>,
}

/// One place in the admission queue; given back when dropped.
pub struct QueueSlot(Arc<AtomicUsize>);

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes of a request being held; released when dropped.
pub struct Reservation {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Limits {
    /// Limits with `memory_bytes` for requests in flight.
    pub fn new(memory_bytes: u64, max_connections: usize, idle: Duration, read: Duration) -> Self {
        // Permits are bytes; tokio caps a semaphore at usize::MAX >> 3.
        let permits = memory_bytes.min((usize::MAX >> 3) as u64) as usize;
        Self {
            memory: Arc::new(Semaphore::new(permits)),
            memory_bytes,
            max_connections: max_connections.max(1),
            idle_timeout: idle,
            read_timeout: read,
            max_queued: usize::MAX >> 4,
            queue_timeout: Duration::from_secs(3600),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// With an admission queue of `max_queued` waiting at most `timeout`.
    pub fn with_queue(mut self, max_queued: usize, timeout: Duration) -> Self {
        self.max_queued = max_queued;
        self.queue_timeout = timeout;
        self
    }

    /// A place in the admission queue, or None when `max_queued` wait already.
    pub fn enqueue(&self) -> Option<QueueSlot> {
        let before = self.waiting.fetch_add(1, Ordering::Relaxed);
        let slot = QueueSlot(self.waiting.clone());
        (before < self.max_queued).then_some(slot)
    }

    /// Requests waiting for admission now.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
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
                "server busy: {} of {} bytes of request memory in use; retry with back-off",
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
/// response is ready (a unary handler keeps the decoded message that long).
/// A frame that does not fit fails the request with RESOURCE_EXHAUSTED, the
/// rest of its body unread.
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
    S: tower::Service<http::Request<tonic::body::Body>>,
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
        let held: Held = Default::default();
        let limits = self.limits.clone();
        let h = held.clone();
        let req = req.map(move |b| {
            tonic::body::Body::new(ChargedBody {
                inner: Box::pin(b),
                limits,
                held: h,
            })
        });
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(held);
            r
        })
    }
}

struct ChargedBody<B> {
    inner: std::pin::Pin<Box<B>>,
    limits: Limits,
    held: Held,
}

impl<B> http_body::Body for ChargedBody<B>
where
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    match this.limits.reserve(d.len() as u64) {
                        Ok(r) => this.held.lock().push(r),
                        Err(status) => return Poll::Ready(Some(Err(Box::new(status)))),
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A gRPC connection holding one of `server.max_connections` slots.
pub struct Capped {
    /// The connection.
    pub io: tokio::net::TcpStream,
    /// Given back when the connection ends.
    pub _slot: OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for Capped {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl tokio::io::AsyncRead for Capped {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
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
