//! Leases: a `Lookup` may pin the prefix it found so the client can read it
//! before eviction takes it away. A lease is a time-bounded pin plus a record
//! the client can present to `Read`; reading under an expired lease fails
//! loudly rather than silently racing eviction.
//!
//! Pins are charged in bytes: a pinned block (and the ancestors it keeps,
//! since eviction only takes leaves) cannot make room for anyone else, so the
//! bytes leases pin are capped in total and per namespace ([`PinBudget`]).
//! Without the caps, leasing 55 blocks for 60 s on a 64 MiB tier made every
//! other write fail, and re-leasing kept it so (the caps and their defaults:
//! docs/operations.md, "Memory"). A charge lasts until its lease's deadline
//! even when the lease is released early, because the tiers' pins do too.
use crate::Namespace;
use crate::block::BlockId;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
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
    /// The blocks it pins (unpinned on early release).
    ids: Vec<BlockId>,
    blocks: usize,
    /// Namespace of the leased blocks (a lease never spans namespaces).
    namespace: Option<crate::Namespace>,
}

/// What pinning `ids` in order holds in one tier, per id: its own entry and
/// the resident ancestors not already counted (eviction takes leaves only, so
/// a pinned block keeps its whole chain). `entry` gives a resident block's
/// cost and parent; absent ids cost 0.
pub fn chain_costs(
    ids: &[BlockId],
    entry: impl Fn(&BlockId) -> Option<(u64, Option<crate::Key>)>,
) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    ids.iter()
        .map(|id| {
            let mut cost = 0;
            let mut cur = Some(id.clone());
            while let Some(at) = cur.take() {
                let Some((c, parent)) = entry(&at) else { break };
                if !seen.insert(at.clone()) {
                    break;
                }
                cost += c;
                cur = parent.map(|k| BlockId::new(at.namespace.clone(), k));
            }
            cost
        })
        .collect()
}

/// Caps on the bytes leases may pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinBudget {
    /// All namespaces together.
    pub total: u64,
    /// One namespace.
    pub per_namespace: u64,
}

impl PinBudget {
    /// No caps.
    pub const UNLIMITED: PinBudget = PinBudget {
        total: u64::MAX,
        per_namespace: u64::MAX,
    };
}

/// Bytes pinned by leases whose deadline has not passed.
#[derive(Default)]
struct Charges {
    total: u64,
    by_namespace: HashMap<Namespace, u64>,
    /// (deadline, lease id) -> (namespace, bytes)
    until: BTreeMap<(Instant, u64), (Namespace, u64)>,
}

impl Charges {
    fn expire(&mut self, now: Instant) {
        while let Some(entry) = self.until.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (ns, bytes) = entry.remove();
            self.total -= bytes;
            if let Some(b) = self.by_namespace.get_mut(&ns) {
                *b -= bytes;
                if *b == 0 {
                    self.by_namespace.remove(&ns);
                }
            }
        }
    }
}

/// The table of active leases.
pub struct LeaseTable {
    active: Mutex<HashMap<u64, Lease>>,
    budget: PinBudget,
    charges: Mutex<Charges>,
}

impl Default for LeaseTable {
    fn default() -> Self {
        Self::new(PinBudget::UNLIMITED)
    }
}

impl LeaseTable {
    /// An empty table whose leases may pin at most `budget`.
    pub fn new(budget: PinBudget) -> Self {
        Self {
            active: Mutex::new(HashMap::new()),
            budget,
            charges: Mutex::new(Charges::default()),
        }
    }

    /// How many leading `ids` fit the pin budget, given what pinning each
    /// costs (`costs[i]`, bytes); reserves their bytes until `now + dur` under
    /// a new lease id, returned with the count. 0 fits: nothing is reserved.
    pub fn charge(&self, ids: &[BlockId], costs: &[u64], dur: Duration) -> (u64, usize, Instant) {
        let now = Instant::now();
        let Some(first) = ids.first() else {
            return (0, 0, now + dur);
        };
        let mut c = self.charges.lock();
        c.expire(now);
        let ns_used = c.by_namespace.get(&first.namespace).copied().unwrap_or(0);
        let room = self
            .budget
            .total
            .saturating_sub(c.total)
            .min(self.budget.per_namespace.saturating_sub(ns_used));
        let (mut n, mut bytes) = (0, 0u64);
        for &cost in costs.iter().take(ids.len()) {
            if bytes + cost > room {
                break;
            }
            bytes += cost;
            n += 1;
        }
        let id = self.fresh_id();
        if n > 0 && bytes > 0 {
            c.total += bytes;
            *c.by_namespace.entry(first.namespace.clone()).or_default() += bytes;
            c.until
                .insert((now + dur, id), (first.namespace.clone(), bytes));
        }
        (id, n, now + dur)
    }

    /// A new lease id: 63 bits from the thread's CSPRNG, never 0 (no lease)
    /// and never an active lease's. Sequential ids let a tenant count other
    /// tenants' leases and name them (docs/security.md, "Threats and their
    /// guards"); random ones also keep the ids of a cluster's nodes, and of
    /// one node across restarts, apart. Below 2^63 for clients that hold
    /// them as signed integers.
    fn fresh_id(&self) -> u64 {
        let active = self.active.lock();
        loop {
            let id = rand::random::<u64>() >> 1;
            if id != 0 && !active.contains_key(&id) {
                return id;
            }
        }
    }

    /// Bytes pinned now: (all namespaces, namespace `ns`).
    pub fn pinned_bytes(&self, ns: &Namespace) -> (u64, u64) {
        let mut c = self.charges.lock();
        c.expire(Instant::now());
        (c.total, c.by_namespace.get(ns).copied().unwrap_or(0))
    }

    /// Bytes pinned now, all namespaces.
    pub fn pinned_total(&self) -> u64 {
        let mut c = self.charges.lock();
        c.expire(Instant::now());
        c.total
    }

    /// The budget leases are charged against.
    pub fn budget(&self) -> PinBudget {
        self.budget
    }

    /// Records lease `id` (from [`LeaseTable::charge`]) over `ids`, already
    /// pinned by the caller until `expires_at` (the deadline `charge` gave).
    pub fn grant(&self, id: u64, ids: &[BlockId], expires_at: Instant) -> Result<LeaseGrant> {
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
        if g.contains_key(&id) {
            // Two charges drew the same 63 random bits at once: refused
            // rather than one lease replacing the other.
            return Err(Error::exhausted(format!(
                "lease id {id} was drawn twice; try again"
            )));
        }
        let dur = expires_at.saturating_duration_since(now);
        g.insert(
            id,
            Lease {
                expires_at,
                ids: ids.to_vec(),
                blocks: ids.len(),
                namespace: ids.first().map(|b| b.namespace.clone()),
            },
        );
        Ok(LeaseGrant {
            id,
            expires_at,
            expires_unix_ms: crate::clock::unix_ms() + dur.as_millis() as u64,
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

    /// Ends a lease early and gives its pin charge back; returns its blocks
    /// and deadline, so the caller can lift the pins this lease placed.
    pub fn release(&self, id: u64) -> Result<(Vec<BlockId>, Instant)> {
        self.release_if(id, |_| true)
    }

    /// [`LeaseTable::release`] if `allowed` accepts the lease's namespace;
    /// a lease it refuses gets the very answer of one never granted, so a
    /// caller learns nothing about leases it may not touch.
    pub fn release_if(
        &self,
        id: u64,
        allowed: impl FnOnce(Option<&Namespace>) -> bool,
    ) -> Result<(Vec<BlockId>, Instant)> {
        let lease = {
            let mut g = self.active.lock();
            match g.get(&id) {
                Some(l) if allowed(l.namespace.as_ref()) => g.remove(&id),
                _ => None,
            }
        };
        let Some(lease) = lease else {
            return Err(Error::not_found(format!("lease {id} is not active")));
        };
        self.refund(id, lease.expires_at);
        Ok((lease.ids, lease.expires_at))
    }

    /// Gives back the pin charge [`LeaseTable::charge`] reserved under `id`
    /// until `until` (a lease refused after its charge, or released early).
    pub fn refund(&self, id: u64, until: Instant) {
        let mut c = self.charges.lock();
        if let Some((ns, bytes)) = c.until.remove(&(until, id)) {
            c.total -= bytes;
            if let Some(b) = c.by_namespace.get_mut(&ns) {
                *b -= bytes;
                if *b == 0 {
                    c.by_namespace.remove(&ns);
                }
            }
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
