//! When a connection is in use: the requests in service on it and when the
//! last one ended, which is what `server.idle_timeout` measures.
use super::ConnInfo;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Requests in service on one gRPC connection, and when the last one ended:
/// what "idle" means for `server.idle_timeout` (HTTP/2 pings are traffic, not
/// use).
pub struct Activity {
    /// Shared with the connection's slot ([`super::Slot::busy_counter`]): a
    /// connection with a request in service is never evicted.
    active: Arc<AtomicUsize>,
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
    pub(super) fn new(active: Arc<AtomicUsize>) -> Self {
        Self {
            active,
            last_ms: AtomicU64::new(0),
            wrote_ms: AtomicU64::new(0),
            rx_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Something was written to the connection now.
    pub(super) fn wrote(&self) {
        self.wrote_ms.store(self.now_ms(), Ordering::Release);
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
    pub(super) fn received(&self, stamp: Option<std::time::SystemTime>) {
        let ns = stamp
            .and_then(|t| t.duration_since(std::time::SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        self.rx_ns.store(ns, Ordering::Release);
    }

    /// Like [`Activity::idle_for`], also counting writes as use.
    pub(super) fn quiet_for(&self) -> Duration {
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

/// The connection's activity, from a request's extensions (plain or TLS).
pub fn activity_of(ext: &http::Extensions) -> Option<Arc<Activity>> {
    use tonic::transport::server::TlsConnectInfo;
    ext.get::<ConnInfo>()
        .or_else(|| ext.get::<TlsConnectInfo<ConnInfo>>().map(|t| t.get_ref()))
        .map(|c| c.activity.clone())
}
