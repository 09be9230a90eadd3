//! The disk tier's in-memory index: which records exist, their chain links and
//! LRU order. It mirrors the memory tier's bookkeeping (see `memory.rs`) without
//! payloads:
//!
//! ```text
//!   map:     BlockId -> Entry { seq, file hash, cost, tick, children, pin, expiry }
//!   leaves:  tick -> BlockId            (no resident child; LRU eviction order)
//!   expiry:  (unix ms, seq) -> BlockId
//!   orphans: parent BlockId -> [child keys]  (children recorded before their parent)
//!   inflight_parents: parents of writes not yet committed (never evicted)
//! ```
//!
//! Only unpinned leaves are evicted, so chains are eaten from the tail and the
//! set on disk stays prefix-closed. All methods are in-memory only; callers
//! turn the returned [`Removed`] records into unlinks outside the lock.
use crate::block::BlockId;
use crate::keys::Key;
use std::collections::{BTreeMap, HashMap};
use tokio::time::Instant;

/// One committed record.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub seq: u64,
    pub hash: [u8; 16],
    /// Bytes charged against capacity (file size rounded up to 4 KiB).
    pub cost: u64,
    pub crc32c: u32,
    pub payload_len: u64,
    pub parent: Option<Key>,
    pub expires_unix_ms: Option<u64>,
    tick: u64,
    children: Vec<Key>,
    pinned_until: Option<Instant>,
}

impl Entry {
    pub fn new(
        seq: u64,
        hash: [u8; 16],
        cost: u64,
        crc32c: u32,
        payload_len: u64,
        parent: Option<Key>,
        expires_unix_ms: Option<u64>,
    ) -> Self {
        Self {
            seq,
            hash,
            cost,
            crc32c,
            payload_len,
            parent,
            expires_unix_ms,
            tick: 0,
            children: Vec::new(),
            pinned_until: None,
        }
    }
    fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }
    fn pinned(&self, now: Instant) -> bool {
        self.pinned_until.is_some_and(|p| p > now)
    }
    fn expired(&self, now_ms: u64) -> bool {
        self.expires_unix_ms.is_some_and(|e| e <= now_ms)
    }
}

/// A record removed from the index whose file must be unlinked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    pub hash: [u8; 16],
    pub seq: u64,
}

/// Result of looking an id up.
pub(crate) enum Lookup {
    /// Present and live.
    Live(Entry),
    /// Not present.
    Missing,
    /// Present but expired: removed with its descendants.
    Expired(Vec<Removed>),
}

#[derive(Default)]
pub(crate) struct Index {
    map: HashMap<BlockId, Entry>,
    leaves: BTreeMap<u64, BlockId>,
    expiry: BTreeMap<(u64, u64), BlockId>,
    orphans: HashMap<BlockId, Vec<Key>>,
    inflight_parents: HashMap<BlockId, u32>,
    /// Committed bytes.
    pub bytes: u64,
    /// Bytes reserved by writes in flight.
    pub reserved: u64,
    tick: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub expirations: u64,
}

impl Index {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn get(&self, id: &BlockId) -> Option<&Entry> {
        self.map.get(id)
    }

    /// Looks `id` up, refreshing its recency if `touch`; an expired entry is
    /// removed (with its descendants) and reported.
    pub fn lookup(&mut self, id: &BlockId, now_ms: u64, touch: bool) -> Lookup {
        let Some(e) = self.map.get(id) else {
            return Lookup::Missing;
        };
        if e.expired(now_ms) {
            let removed = self.remove_cascade(id);
            self.expirations += removed.len() as u64;
            return Lookup::Expired(removed);
        }
        if touch {
            self.tick += 1;
            let tick = self.tick;
            let e = self.map.get_mut(id).expect("present");
            let old = std::mem::replace(&mut e.tick, tick);
            if e.is_leaf() {
                self.leaves.remove(&old);
                self.leaves.insert(tick, id.clone());
            }
        }
        Lookup::Live(self.map[id].clone())
    }

    /// Inserts a committed record (the id must not be present).
    pub fn insert(&mut self, id: BlockId, mut e: Entry) {
        debug_assert!(!self.map.contains_key(&id));
        self.tick += 1;
        e.tick = self.tick;
        e.children = self.orphans.remove(&id).unwrap_or_default();
        if let Some(exp) = e.expires_unix_ms {
            self.expiry.insert((exp, e.seq), id.clone());
        }
        if let Some(parent) = e.parent.clone() {
            let pid = BlockId::new(id.namespace.clone(), parent);
            match self.map.get_mut(&pid) {
                Some(p) => {
                    if p.is_leaf() {
                        self.leaves.remove(&p.tick);
                    }
                    p.children.push(id.key.clone());
                }
                None => self.orphans.entry(pid).or_default().push(id.key.clone()),
            }
        }
        if e.is_leaf() {
            self.leaves.insert(e.tick, id.clone());
        }
        self.bytes += e.cost;
        self.map.insert(id, e);
    }

    /// Marks `parent` as the parent of a write in flight (protected from eviction).
    pub fn hold_parent(&mut self, parent: &BlockId) {
        *self.inflight_parents.entry(parent.clone()).or_default() += 1;
    }

    /// Undoes [`Index::hold_parent`].
    pub fn release_parent(&mut self, parent: &BlockId) {
        if let Some(n) = self.inflight_parents.get_mut(parent) {
            *n -= 1;
            if *n == 0 {
                self.inflight_parents.remove(parent);
            }
        }
    }

    /// Evicts LRU unpinned leaves (never `protect` nor a parent of a write in
    /// flight) until `need` more bytes fit under `capacity` next to what is
    /// committed and reserved. On failure nothing further is evicted and the
    /// victims removed so far are returned in `Err`.
    pub fn evict_for(
        &mut self,
        need: u64,
        capacity: u64,
        protect: Option<&BlockId>,
        now: Instant,
    ) -> Result<Vec<Removed>, Vec<Removed>> {
        let mut out = Vec::new();
        while self.bytes + self.reserved + need > capacity {
            let victim = self
                .leaves
                .values()
                .find(|id| {
                    Some(*id) != protect
                        && !self.inflight_parents.contains_key(*id)
                        && !self.map.get(*id).is_some_and(|e| e.pinned(now))
                })
                .cloned();
            let Some(id) = victim else { return Err(out) };
            out.extend(self.remove_cascade(&id));
            self.evictions += 1;
        }
        Ok(out)
    }

    /// Bytes pinned by leases now.
    pub fn pinned_bytes(&self, now: Instant) -> u64 {
        self.map
            .values()
            .filter(|e| e.pinned(now))
            .map(|e| e.cost)
            .sum()
    }

    /// Removes every expired record; returns them.
    pub fn purge_expired(&mut self, now_ms: u64) -> Vec<Removed> {
        let mut out = Vec::new();
        while let Some((&(t, _), _)) = self.expiry.first_key_value() {
            if t > now_ms {
                break;
            }
            let (_, id) = self.expiry.pop_first().expect("non-empty");
            out.extend(self.remove_cascade(&id));
        }
        self.expirations += out.len() as u64;
        out
    }

    /// Lifts the pins that end exactly at `until` (an early-released lease's).
    pub fn unpin(&mut self, ids: &[BlockId], until: Instant) {
        for id in ids {
            if let Some(e) = self.map.get_mut(id)
                && e.pinned_until == Some(until)
            {
                e.pinned_until = None;
            }
        }
    }

    /// Pins present records until `until`; returns how many were present.
    pub fn pin(&mut self, ids: &[BlockId], until: Instant) -> usize {
        let mut n = 0;
        for id in ids {
            if let Some(e) = self.map.get_mut(id) {
                e.pinned_until = Some(e.pinned_until.map_or(until, |p| p.max(until)));
                n += 1;
            }
        }
        n
    }

    /// Removes `id` and its descendants. The result lists descendants before
    /// ancestors, so unlinking in order never leaves a child without its parent.
    pub fn remove_cascade(&mut self, id: &BlockId) -> Vec<Removed> {
        let mut stack = vec![id.clone()];
        let mut out = Vec::new();
        while let Some(cur) = stack.pop() {
            let Some(e) = self.map.remove(&cur) else {
                continue;
            };
            self.bytes -= e.cost;
            if e.is_leaf() {
                self.leaves.remove(&e.tick);
            }
            if let Some(exp) = e.expires_unix_ms {
                self.expiry.remove(&(exp, e.seq));
            }
            for c in &e.children {
                stack.push(BlockId::new(cur.namespace.clone(), c.clone()));
            }
            if let Some(p) = &e.parent {
                let pid = BlockId::new(cur.namespace.clone(), p.clone());
                if let Some(pe) = self.map.get_mut(&pid) {
                    pe.children.retain(|k| k != &cur.key);
                    if pe.children.is_empty() {
                        self.leaves.insert(pe.tick, pid);
                    }
                } else if let Some(o) = self.orphans.get_mut(&pid) {
                    o.retain(|k| k != &cur.key);
                    if o.is_empty() {
                        self.orphans.remove(&pid);
                    }
                }
            }
            out.push(Removed {
                hash: e.hash,
                seq: e.seq,
            });
        }
        out.reverse();
        out
    }

    /// Checks byte accounting, the leaf set and the parent/child links.
    pub fn check_invariants(&self) -> Result<(), String> {
        let bytes: u64 = self.map.values().map(|e| e.cost).sum();
        if bytes != self.bytes {
            return Err(format!("byte count {} != sum {bytes}", self.bytes));
        }
        for (id, e) in &self.map {
            let in_leaves = self.leaves.get(&e.tick) == Some(id);
            if e.is_leaf() != in_leaves {
                return Err(format!(
                    "{id:?}: leaf={} in_leaves={in_leaves}",
                    e.is_leaf()
                ));
            }
            for c in &e.children {
                let cid = BlockId::new(id.namespace.clone(), c.clone());
                match self.map.get(&cid) {
                    Some(ch) if ch.parent.as_ref() == Some(&id.key) => {}
                    _ => return Err(format!("{id:?} lists non-resident child {c:?}")),
                }
            }
            if let Some(p) = &e.parent {
                let pid = BlockId::new(id.namespace.clone(), p.clone());
                let linked = self
                    .map
                    .get(&pid)
                    .is_some_and(|pe| pe.children.contains(&id.key));
                let orphan = self.orphans.get(&pid).is_some_and(|o| o.contains(&id.key));
                if linked == orphan {
                    return Err(format!("{id:?}: linked={linked} orphan={orphan}"));
                }
            }
        }
        if self.leaves.len() > self.map.len() {
            return Err("stale leaves".into());
        }
        Ok(())
    }
}
