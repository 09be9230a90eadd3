//! Server timing: when a request arrived, when its handler started, and how
//! long the engine spent in each tier. Every response carries the result so a
//! client can compute network time = end-to-end − server total.
//!
//! ```text
//!  headers arrive ──(queue: body receive, decode, admission)──▶ handler starts
//!  handler starts ──(service, of which storage per tier)──────▶ response ready
//! ```
use kvtier_core::StorageTiming;
use kvtier_proto::v1::ServerTiming;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Stamped into request extensions by [`ArrivalLayer`] when headers arrive.
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub Instant);

/// Tower layer that records [`Arrival`] on every HTTP/2 request.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArrivalLayer;

impl<S> tower::Layer<S> for ArrivalLayer {
    type Service = ArrivalService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ArrivalService { inner }
    }
}

/// See [`ArrivalLayer`].
#[derive(Debug, Clone)]
pub struct ArrivalService<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for ArrivalService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tokio::task::futures::TaskLocalFuture<Option<Instant>, S::Future>;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let now = Instant::now();
        req.extensions_mut().insert(Arrival(now));
        // The handler (and the tiers below it) see the client's deadline.
        let deadline = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| grpc_timeout(v.to_str().ok()?))
            .and_then(|t| now.checked_add(t));
        kvtier_core::deadline::scope(deadline, self.inner.call(req))
    }
}

/// A `grpc-timeout` header value ("100m", "5S", …) as a duration.
pub fn grpc_timeout(v: &str) -> Option<Duration> {
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Timing of one request in progress.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// When the request arrived.
    pub arrived: Instant,
    /// When the handler started (after admission).
    pub started: Instant,
    /// Engine time per tier.
    pub storage: StorageTiming,
}

impl Clock {
    /// Starts the service clock for a request that arrived at `arrived`.
    pub fn start(arrived: Option<Instant>) -> Self {
        let now = Instant::now();
        Self {
            arrived: arrived.unwrap_or(now),
            started: now,
            storage: StorageTiming::default(),
        }
    }

    /// Time between arrival and handler start.
    pub fn queue(&self) -> Duration {
        self.started.saturating_duration_since(self.arrived)
    }

    /// Restarts the service clock now (after waiting for admission).
    pub fn admitted(&mut self) {
        self.started = Instant::now();
    }

    /// The wire form, measured now.
    pub fn finish(&self) -> ServerTiming {
        let service = self.started.elapsed();
        let queue = self.queue();
        ServerTiming {
            queue_us: us(queue),
            service_us: us(service),
            storage_memory_us: us(self.storage.memory),
            storage_disk_us: us(self.storage.disk),
            storage_object_us: us(self.storage.object),
            storage_peer_us: us(self.storage.peer),
            total_us: us(queue + service),
        }
    }
}

/// Whole microseconds.
pub fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}
