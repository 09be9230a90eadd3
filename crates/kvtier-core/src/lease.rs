//! Leases: a `Lookup` may pin the prefix it found so the client can read it
//! before eviction takes it away. A lease is a time-bounded pin plus a record
//! the client can present to `Read`; reading under an expired lease fails
//! loudly rather than silently racing eviction.
use crate::block::BlockId;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Upper bound on simultaneously active leases; expired ones are purged first.
pub const MAX_ACTIVE_LEASES: usize = 1 << 20;

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Identifier to present to `Read` or to release.
    pub id: u64,
    /// When the pin ends.
    pub expires_at: Instant,
    /// Same, as Unix milliseconds (for the wire).
    pub expires_unix_ms: u64,
}

struct Lease {
    expires_at: Instant,
    blocks: usize,
    /// Namespace of the leased blocks (a lease never spans namespaces).
    namespace: Option<crate::Namespace>,
}

/// The table of active leases.
pub struct LeaseTable {
    next: AtomicU64,
    active: Mutex<HashMap<u64, Lease>>,
}

impl Default for LeaseTable {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(1),
            active: Mutex::new(HashMap::new()),
        }
    }
}

impl LeaseTable {
    /// Records a lease over `ids` (already pinned by the caller) for `dur`.
    pub fn grant(&self, ids: &[BlockId], dur: Duration) -> Result<LeaseGrant> {
        let now = Instant::now();
        let mut g = self.active.lock();
        if g.len() >= MAX_ACTIVE_LEASES {
            g.retain(|_, l| l.expires_at > now);
            if g.len() >= MAX_ACTIVE_LEASES {
                return Err(Error::exhausted(format!(
                    "{MAX_ACTIVE_LEASES} leases active; release some or use shorter leases"
                )));
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let expires_at = now + dur;
        g.insert(
            id,
            Lease {
                expires_at,
                blocks: ids.len(),
                namespace: ids.first().map(|b| b.namespace.clone()),
            },
        );
        Ok(LeaseGrant {
            id,
            expires_at,
            expires_unix_ms: crate::memory::unix_ms() + dur.as_millis() as u64,
        })
    }

    /// Fails unless lease `id` is active.
    pub fn check(&self, id: u64) -> Result<()> {
        let now = Instant::now();
        let mut g = self.active.lock();
        match g.get(&id) {
            None => Err(Error::precondition(format!(
                "lease {id} is unknown (expired, released or never granted)"
            ))),
            Some(l) if l.expires_at <= now => {
                let late = now - l.expires_at;
                g.remove(&id);
                Err(Error::precondition(format!(
                    "lease {id} expired {} ms ago; look the prefix up again",
                    late.as_millis()
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// Namespace of active lease `id` (for access control), if it is active.
    pub fn namespace_of(&self, id: u64) -> Option<crate::Namespace> {
        self.active
            .lock()
            .get(&id)
            .and_then(|l| l.namespace.clone())
    }

    /// Ends a lease early. Pins already placed run out at their own deadline.
    pub fn release(&self, id: u64) -> Result<()> {
        match self.active.lock().remove(&id) {
            Some(_) => Ok(()),
            None => Err(Error::not_found(format!("lease {id} is not active"))),
        }
    }

    /// Active leases and the blocks they cover (expired ones are dropped).
    pub fn active(&self) -> (u64, u64) {
        let now = Instant::now();
        let mut g = self.active.lock();
        g.retain(|_, l| l.expires_at > now);
        (g.len() as u64, g.values().map(|l| l.blocks as u64).sum())
    }
}
