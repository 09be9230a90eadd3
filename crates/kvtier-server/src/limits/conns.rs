//! Who holds a listener's connection slots, so a flood cannot lock real
//! clients out (docs/operations.md, "Connection floods").
//!
//! Each listener keeps a table of its open connections in the order they
//! were accepted, each marked busy while a request is in service on it.
//! When the listener is full, a new connection takes the slot of the oldest
//! *idle* one (never a busy one): 5,000 idle sockets then hold slots only
//! until real clients arrive, instead of refusing them (and the health probe
//! behind them) with a reset. Per client address the count is bounded the
//! same way, so one host cannot take every slot. Only when every slot is
//! busy is a connection refused; the HTTP listener then still admits a few
//! [`RESERVE`] connections that may only ask for `/healthz` and `/metrics`.
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Connections the HTTP listener admits past a full table of busy ones,
/// for health and metrics only.
pub const RESERVE: usize = 64;

/// One listener's connection table.
#[derive(Clone)]
pub struct Conns {
    table: Arc<Mutex<Table>>,
    max: usize,
    per_client: usize,
    reserve: usize,
}

#[derive(Default)]
struct Table {
    next: u64,
    /// By accept order: the first idle entry is the oldest idle connection.
    open: BTreeMap<u64, Entry>,
    per_client: HashMap<IpAddr, usize>,
    reserved: usize,
}

struct Entry {
    client: Option<IpAddr>,
    shared: Arc<Shared>,
}

/// What a connection and its table share.
#[derive(Default)]
struct Shared {
    /// Requests in service on the connection (for gRPC, the connection's
    /// [`super::Activity`] counts them in this same counter).
    busy: Arc<AtomicUsize>,
    /// Set, and signalled, when the table gives the connection's slot away.
    evicted: AtomicBool,
    close: Notify,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Every slot holds a busy connection (`server.max_connections`).
    Listener,
    /// This client's every slot is busy (`server.max_connections_per_client`).
    Client,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Full::Listener => "every connection is busy (server.max_connections)",
            Full::Client => {
                "this client's every connection is busy (server.max_connections_per_client)"
            }
        })
    }
}

/// An admitted connection's slot; given back when dropped.
pub struct Slot {
    id: u64,
    table: Arc<Mutex<Table>>,
    shared: Arc<Shared>,
    reserved: bool,
}

/// A request in service on a connection: the connection is busy (never
/// evicted) until this is dropped.
pub struct Busy(Arc<Shared>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slot {
    /// Marks a request in service until the guard is dropped.
    pub fn busy(&self) -> Busy {
        self.shared.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.shared.clone())
    }

    /// Resolves when the listener gave this slot to a newer connection:
    /// the connection must then close.
    pub fn evicted(&self) -> impl Future<Output = ()> + Send + 'static {
        let s = self.shared.clone();
        async move {
            if !s.evicted.load(Ordering::Acquire) {
                s.close.notified().await;
            }
        }
    }

    /// The connection's count of requests in service, for a front that
    /// already keeps one (gRPC's [`super::Activity`]).
    pub fn busy_counter(&self) -> Arc<AtomicUsize> {
        self.shared.busy.clone()
    }

    /// Admitted past a full table, for health and metrics only.
    pub fn reserved(&self) -> bool {
        self.reserved
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.table.lock();
        if self.reserved {
            t.reserved -= 1;
        } else if let Some(e) = t.open.remove(&self.id) {
            t.forget(e.client);
        }
    }
}

impl Table {
    fn forget(&mut self, client: Option<IpAddr>) {
        if let Some(c) = client
            && let Some(n) = self.per_client.get_mut(&c)
        {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&c);
            }
        }
    }

    /// Gives the slot of the oldest idle connection (of `client`, if given)
    /// away: it is told to close and no longer counts.
    fn evict_oldest_idle(&mut self, client: Option<IpAddr>) -> bool {
        let victim = self.open.iter().find_map(|(id, e)| {
            let idle = e.shared.busy.load(Ordering::Acquire) == 0;
            (idle && (client.is_none() || e.client == client)).then_some(*id)
        });
        let Some(id) = victim else { return false };
        let e = self.open.remove(&id).expect("found above");
        self.forget(e.client);
        e.shared.evicted.store(true, Ordering::Release);
        e.shared.close.notify_one();
        true
    }
}

impl Conns {
    /// A table of `max` slots, at most `per_client` per client address, and
    /// `reserve` more for health checks when every slot is busy.
    pub fn new(max: usize, per_client: usize, reserve: usize) -> Self {
        Self {
            table: Default::default(),
            max: max.max(1),
            per_client: per_client.max(1),
            reserve,
        }
    }

    /// Admits a connection from `client` (`None`: a same-host socket, not
    /// counted per client), evicting the oldest idle one where the table or
    /// the client is full.
    pub fn admit(&self, client: Option<IpAddr>) -> Result<Slot, Full> {
        let mut t = self.table.lock();
        if let Some(c) = client
            && t.per_client.get(&c).copied().unwrap_or(0) >= self.per_client
            && !t.evict_oldest_idle(Some(c))
        {
            return Err(Full::Client);
        }
        let shared = Arc::new(Shared::default());
        if t.open.len() >= self.max && !t.evict_oldest_idle(None) {
            if t.reserved >= self.reserve {
                return Err(Full::Listener);
            }
            t.reserved += 1;
            let id = t.next;
            t.next += 1;
            return Ok(Slot {
                id,
                table: self.table.clone(),
                shared,
                reserved: true,
            });
        }
        let id = t.next;
        t.next += 1;
        t.open.insert(
            id,
            Entry {
                client,
                shared: shared.clone(),
            },
        );
        if let Some(c) = client {
            *t.per_client.entry(c).or_default() += 1;
        }
        Ok(Slot {
            id,
            table: self.table.clone(),
            shared,
            reserved: false,
        })
    }

    /// Connections holding a slot now (reserved ones not counted).
    pub fn open(&self) -> usize {
        self.table.lock().open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    async fn told_to_close(s: &Slot) -> bool {
        tokio::time::timeout(Duration::from_millis(50), s.evicted())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_full_listener_gives_the_oldest_idle_slot_to_a_new_connection() {
        let c = Conns::new(2, 100, 0);
        let oldest = c.admit(ip(1)).unwrap();
        let busy = c.admit(ip(2)).unwrap();
        let _serving = busy.busy();
        let fresh = c.admit(ip(3)).expect("admitted in the idle one's place");
        assert!(told_to_close(&oldest).await, "the oldest idle was evicted");
        assert!(!told_to_close(&busy).await, "a busy connection never is");
        assert_eq!(c.open(), 2);
        // Every slot busy now: refused.
        let _f = fresh.busy();
        assert_eq!(c.admit(ip(4)).err(), Some(Full::Listener));
        drop(oldest); // its task ends later: nothing counted twice
        assert_eq!(c.open(), 2);
    }

    #[tokio::test]
    async fn one_client_cannot_take_every_slot() {
        let c = Conns::new(10, 2, 0);
        let a = c.admit(ip(1)).unwrap();
        let b = c.admit(ip(1)).unwrap();
        let (_a, _b) = (a.busy(), b.busy());
        assert_eq!(c.admit(ip(1)).err(), Some(Full::Client));
        assert!(c.admit(ip(2)).is_ok(), "other clients still get in");
        drop(_b);
        let _third = c.admit(ip(1)).expect("its own idle slot is reused");
        assert!(told_to_close(&b).await);
    }

    #[tokio::test]
    async fn when_every_slot_is_busy_the_reserve_admits_health_checks() {
        let c = Conns::new(1, 10, 1);
        let s = c.admit(ip(1)).unwrap();
        let _b = s.busy();
        let r = c.admit(ip(2)).expect("reserved");
        assert!(r.reserved());
        assert_eq!(
            c.admit(ip(3)).err(),
            Some(Full::Listener),
            "reserve used up"
        );
        drop(r);
        assert!(c.admit(ip(3)).unwrap().reserved(), "reserve given back");
    }
}
