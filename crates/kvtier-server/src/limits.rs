//! Limits every front shares (docs/operations.md): the bytes of requests held
//! in memory while they arrive, open connections, and how long a connection
//! may idle or a request may take to arrive.
//!
//! Why: bytes still arriving count against no other budget. Without this, 16
//! data-plane connections each sending most of a 251 MiB Write and stalling
//! held 4 GiB against a 512 MiB memory tier (docs/operations.md, "Memory"; notes/011); idle connections were
//! never closed, so enough of them exhausted the file descriptors.
use crate::refusal::{Kind, Refusal};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

mod activity;
mod capped;
mod charged;
mod conns;
mod layer;
pub mod refused;
mod reply;
pub use activity::{Activity, InUse, activity_of};
pub use capped::{Capped, ConnInfo, DRAIN_IDLE};
pub use conns::{Busy, Conns, Full, RESERVE, Slot};
pub use layer::{ChargeLayer, ChargeService};

/// Most reads, across the server, that requests ended early (a data-plane
/// reply that filled up) may leave running in the background so that what
/// they fetch is promoted: four requests' worth at the default object-store
/// read-ahead of 16.
pub const HANDOFF_READS: usize = 64;

/// The retry hint of a request refused because the request memory is in
/// use now: about the time a large upload in flight takes to be stored.
pub const BUSY_RETRY: Duration = Duration::from_millis(50);

/// Labels of [`STALLED`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct FrontLabel {
    /// `data` or `grpc`.
    pub front: &'static str,
}

/// Replies dropped because their client took none of them for
/// `server.write_timeout`, by front: the metric
/// `kvtier_stalled_replies_total`. Process-wide: every server in it counts here.
pub static STALLED: std::sync::LazyLock<
    prometheus_client::metrics::family::Family<
        FrontLabel,
        prometheus_client::metrics::counter::Counter,
    >,
> = std::sync::LazyLock::new(Default::default);

/// Counts and logs (at most once a second) a reply dropped on `front`
/// because its client stopped reading.
pub fn stalled(front: &'static str, write_timeout: Duration) {
    STALLED.get_or_create(&FrontLabel { front }).inc();
    refused::log_dropped(
        front,
        &format!(
            "the client took nothing of its reply for {write_timeout:?} (server.write_timeout)"
        ),
    );
}

/// The shared limits of one server.
#[derive(Clone)]
pub struct Limits {
    memory: Arc<Semaphore>,
    /// Bytes of replies written to clients that have not taken them yet
    /// (`server.reply_memory`, see [`Limits::reserve_reply`]).
    replies: Arc<Semaphore>,
    /// `server.reply_memory` in bytes.
    pub reply_bytes: u64,
    /// `server.write_timeout`: a reply the client takes no byte of for this
    /// long is dropped and its connection closed.
    pub write_timeout: Duration,
    /// Reads a finished request left in flight and handed to the background
    /// (`PrefixReader::put_back`), across the server.
    handoff: Arc<Semaphore>,
    /// `server.request_memory` in bytes.
    pub memory_bytes: u64,
    /// `server.max_connections`, per listener.
    pub max_connections: usize,
    /// `server.max_connections_per_client`, per listener.
    pub max_connections_per_client: usize,
    /// `server.header_timeout`.
    pub header_timeout: Duration,
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

    /// Adds `other`'s bytes to this one (both of the same budget).
    pub fn merge(&mut self, other: Reservation) {
        let Some(o) = other._permit else { return };
        if let Some(p) = self._permit.as_mut() {
            p.merge(o);
        } else {
            self._permit = Some(o);
        }
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

/// The reservations a request holds, oldest first.
type Held = Arc<parking_lot::Mutex<Vec<Reservation>>>;

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
            replies: Arc::new(Semaphore::new(permits)),
            reply_bytes: memory_bytes,
            write_timeout: idle,
            handoff: Arc::new(Semaphore::new(HANDOFF_READS)),
            memory_bytes,
            max_connections: max_connections.max(1),
            max_connections_per_client: max_connections.max(1),
            header_timeout: read,
            idle_timeout: idle,
            read_timeout: read,
        }
    }

    /// The same limits with `server.max_connections_per_client` and
    /// `server.header_timeout` set.
    pub fn with_connections(mut self, per_client: usize, header_timeout: Duration) -> Self {
        self.max_connections_per_client = per_client.max(1);
        self.header_timeout = header_timeout;
        self
    }

    /// The same limits with `server.reply_memory` (0: as much as the
    /// request memory) and `server.write_timeout` set.
    pub fn with_replies(mut self, reply_bytes: u64, write_timeout: Duration) -> Self {
        let bytes = if reply_bytes == 0 {
            self.memory_bytes
        } else {
            reply_bytes
        };
        self.replies = Arc::new(Semaphore::new(bytes.min((usize::MAX >> 3) as u64) as usize));
        self.reply_bytes = bytes;
        self.write_timeout = write_timeout;
        self
    }

    /// Takes `bytes` of a reply from the reply budget (`server.reply_memory`)
    /// until the reply has been written, or refuses it as busy (UNAVAILABLE
    /// with a retry hint). Why: a reply holds its payloads (the store's
    /// buffers, kept alive even when the blocks are deleted) until its
    /// client takes them; without a budget, clients that stop reading pinned
    /// deleted blocks without bound (docs/security.md, "Threats and their
    /// guards"). A reply larger than the whole budget takes all of it.
    pub fn reserve_reply(&self, bytes: u64) -> Result<Reservation, Refusal> {
        let n = self.reply_permits(bytes);
        if n == 0 {
            return Ok(Reservation { _permit: None });
        }
        match self.replies.clone().try_acquire_many_owned(n) {
            Ok(p) => Ok(Reservation { _permit: Some(p) }),
            Err(_) => Err(self.replies_busy()),
        }
    }

    /// As [`Limits::reserve_reply`], but waits (in arrival order) for the
    /// bytes until `until`, or at most `server.write_timeout`: a reply's
    /// first block. Why wait: replies give their bytes back as their clients
    /// take them, and a stalled one within `write_timeout`, so a striped
    /// load bigger than the budget (a 2 GiB prompt over four connections)
    /// is served in turn instead of refused; only a budget that stays full
    /// that long is refused as busy.
    pub async fn reserve_reply_wait(
        &self,
        bytes: u64,
        until: Option<tokio::time::Instant>,
    ) -> Result<Reservation, Refusal> {
        let n = self.reply_permits(bytes);
        if n == 0 {
            return Ok(Reservation { _permit: None });
        }
        let cap = tokio::time::Instant::now() + self.write_timeout;
        let until = until.map_or(cap, |u| u.min(cap));
        let take = self.replies.clone().acquire_many_owned(n);
        match tokio::time::timeout_at(until, take).await {
            Ok(Ok(p)) => Ok(Reservation { _permit: Some(p) }),
            _ => Err(self.replies_busy()),
        }
    }

    fn reply_permits(&self, bytes: u64) -> u32 {
        bytes.min(self.reply_bytes).min(u32::MAX as u64) as u32
    }

    fn replies_busy(&self) -> Refusal {
        Refusal {
            kind: Kind::Overloaded,
            message: format!(
                "server busy: {} of {} bytes of replies waiting for their clients (server.reply_memory); retry with back-off",
                self.replies_in_use(),
                self.reply_bytes
            ),
            retry_after: Some(BUSY_RETRY),
        }
    }

    /// Bytes of replies reserved now.
    pub fn replies_in_use(&self) -> u64 {
        let free = self.replies.available_permits() as u64;
        self.reply_bytes
            .min((usize::MAX >> 3) as u64)
            .saturating_sub(free)
    }

    /// A fresh connection table for one listener; `reserve` connections
    /// past a table of busy ones for health checks ([`RESERVE`] on HTTP).
    pub fn conns(&self, reserve: usize) -> Conns {
        Conns::new(
            self.max_connections,
            self.max_connections_per_client,
            reserve,
        )
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

    /// The refusal of a request of `bytes` that can never fit the request
    /// memory, busy or not (RESOURCE_EXHAUSTED, naming the setting).
    pub fn too_large(&self, bytes: u64) -> Option<Refusal> {
        (bytes > self.memory_bytes || bytes > u32::MAX as u64).then(|| {
            Refusal::new(
                Kind::ResourceExhausted,
                format!(
                    "a request of {bytes} bytes is larger than the server's request memory ({} bytes, server.request_memory)",
                    self.memory_bytes
                ),
            )
        })
    }

    /// Takes `bytes` from the request budget now, or refuses: one that can
    /// never fit with RESOURCE_EXHAUSTED ([`Limits::too_large`]), one that
    /// does not fit now as shed for overload, with a retry hint (never
    /// waits: a client told to retry beats one whose upload sits
    /// half-received holding memory).
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, Refusal> {
        if bytes == 0 {
            return Ok(Reservation { _permit: None });
        }
        if let Some(never) = self.too_large(bytes) {
            return Err(never);
        }
        match self.memory.clone().try_acquire_many_owned(bytes as u32) {
            Ok(p) => Ok(Reservation { _permit: Some(p) }),
            Err(_) => Err(Refusal {
                kind: Kind::Overloaded,
                message: format!(
                    "server busy: {} of {} bytes of request memory (server.request_memory) in use; retry with back-off",
                    self.in_use(),
                    self.memory_bytes
                ),
                retry_after: Some(BUSY_RETRY),
            }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_released() {
        let l = Limits::new(1000, 10, Duration::from_secs(1), Duration::from_secs(1));
        let a = l.reserve(600).unwrap();
        assert_eq!(l.in_use(), 600);
        let e = l.reserve(600).err().unwrap();
        assert_eq!(e.kind, Kind::Overloaded, "busy, not too large: retried");
        assert_eq!(e.retry_after, Some(BUSY_RETRY));
        assert!(e.message.contains("retry"), "{e:?}");
        drop(a);
        assert_eq!(l.in_use(), 0);
        let _b = l.reserve(600).unwrap();
        assert!(
            l.reserve(2000)
                .err()
                .unwrap()
                .message
                .contains("larger than")
        );
        assert!(l.reserve(0).is_ok());
    }

    #[test]
    fn reply_reservations_are_bounded_and_a_huge_reply_takes_the_whole_budget() {
        let l = Limits::new(1000, 10, Duration::from_secs(1), Duration::from_secs(1))
            .with_replies(500, Duration::from_secs(1));
        let a = l.reserve_reply(5000).unwrap();
        assert_eq!(l.replies_in_use(), 500);
        let e = l.reserve_reply(1).err().unwrap();
        assert_eq!(e.kind, Kind::Overloaded);
        assert!(e.message.contains("server.reply_memory"), "{e:?}");
        assert_eq!(l.in_use(), 0, "the request memory is another budget");
        drop(a);
        assert_eq!(l.replies_in_use(), 0);
    }
}
