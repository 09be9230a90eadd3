//! The disk tier's in-memory index: which records exist, their chain links and
//! LRU order. The bookkeeping is the [`ChainIndex`] the memory tier uses too,
//! holding each record's location and metadata instead of its payload, with
//! expiry in Unix milliseconds (records outlive the process). On top of it this
//! module keeps what only the disk needs: bytes reserved by writes in flight
//! and records expressed as the files to unlink.
//!
//! All methods are in-memory only; callers turn the returned [`Removed`]
//! records into unlinks outside the lock.
use crate::block::BlockId;
use crate::chain_index::{ChainIndex, Counters, Found, Node};
use crate::keys::Key;
use crate::shares::{ShareStat, Shares};
use std::sync::Arc;
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
        }
    }
}

impl Node for Entry {
    fn cost(&self) -> u64 {
        self.cost
    }
    fn parent(&self) -> Option<&Key> {
        self.parent.as_ref()
    }
}

/// A record removed from the index whose file must be unlinked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    pub hash: [u8; 16],
    pub seq: u64,
}

fn removed(v: Vec<(BlockId, Entry)>) -> Vec<Removed> {
    v.into_iter()
        .map(|(_, e)| Removed {
            hash: e.hash,
            seq: e.seq,
        })
        .collect()
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

pub(crate) struct Index {
    chain: ChainIndex<Entry, u64>,
    /// Bytes reserved by writes in flight.
    pub reserved: u64,
}

impl Index {
    /// An empty index dividing the tier per `shares`.
    pub fn new(shares: Arc<Shares>) -> Self {
        Self {
            chain: ChainIndex::new(shares),
            reserved: 0,
        }
    }

    /// Resident bytes and evictions per share label.
    pub fn share_stats(&self) -> Vec<ShareStat> {
        self.chain.share_stats()
    }

    /// Reports every later residency change to `o`; returns what is
    /// resident now, so the caller can announce it.
    pub fn observe(
        &mut self,
        o: crate::chain_index::Observer,
    ) -> Vec<(BlockId, Option<crate::keys::Key>)> {
        self.chain.observe(o);
        self.chain.ids()
    }

    /// Bytes resident in the capacity-share group of `ns`.
    pub fn group_bytes(&self, ns: &crate::keys::Namespace) -> u64 {
        self.chain.group_bytes(ns)
    }

    pub fn len(&self) -> usize {
        self.chain.len()
    }

    /// Committed bytes.
    pub fn bytes(&self) -> u64 {
        self.chain.bytes()
    }

    /// Hit, miss, eviction and expiry counts.
    pub fn counters(&self) -> Counters {
        self.chain.counters
    }

    pub fn counters_mut(&mut self) -> &mut Counters {
        &mut self.chain.counters
    }

    pub fn get(&self, id: &BlockId) -> Option<&Entry> {
        self.chain.get(id)
    }

    /// Looks `id` up, refreshing its recency if `touch`; an expired entry is
    /// removed (with its descendants) and reported.
    pub fn lookup(&mut self, id: &BlockId, now_ms: u64, touch: bool) -> Lookup {
        match self.chain.lookup(id, now_ms, touch) {
            Found::Live(e) => Lookup::Live(e.clone()),
            Found::Missing => Lookup::Missing,
            Found::Expired(r) => Lookup::Expired(removed(r)),
        }
    }

    /// Inserts a committed record (the id must not be present).
    pub fn insert(&mut self, id: BlockId, e: Entry) {
        let expires = e.expires_unix_ms;
        self.chain.insert(id, e, expires);
    }

    /// Marks `parent` as the parent of a write in flight (protected from eviction).
    pub fn hold_parent(&mut self, parent: &BlockId) {
        self.chain.hold(parent)
    }

    /// Undoes [`Index::hold_parent`].
    pub fn release_parent(&mut self, parent: &BlockId) {
        self.chain.release(parent)
    }

    /// Evicts LRU unpinned leaves (never `protect` nor a parent of a write in
    /// flight) until `need` more bytes fit under `capacity` next to what is
    /// committed and reserved, from the tenants most over their capacity
    /// share and never one below `writer`'s (the namespace written). On
    /// failure nothing further is evicted and the victims removed so far are
    /// returned in `Err`.
    pub fn evict_for(
        &mut self,
        need: u64,
        capacity: u64,
        protect: Option<&BlockId>,
        writer: Option<&crate::keys::Namespace>,
        now: Instant,
    ) -> Result<Vec<Removed>, Vec<Removed>> {
        let reserved = self.reserved;
        let writer = writer.map(|ns| (ns, need));
        let fits = |bytes| bytes + reserved + need <= capacity;
        self.chain
            .evict_until(fits, protect, writer, now)
            .map(removed)
            .map_err(removed)
    }

    /// Bytes pinned by leases now.
    pub fn pinned_bytes(&self, now: Instant) -> u64 {
        self.chain.pinned_bytes(now)
    }

    /// What pinning `ids` in order holds here, per id.
    pub fn pin_costs(&self, ids: &[BlockId]) -> Vec<u64> {
        self.chain.pin_costs(ids)
    }

    /// Removes every expired record; returns them.
    pub fn purge_expired(&mut self, now_ms: u64) -> Vec<Removed> {
        removed(self.chain.purge_expired(now_ms))
    }

    /// Lifts the pins that end exactly at `until` (an early-released lease's).
    pub fn unpin(&mut self, ids: &[BlockId], until: Instant) {
        self.chain.unpin(ids, until)
    }

    /// Pins present records until `until`; returns how many were present.
    pub fn pin(&mut self, ids: &[BlockId], until: Instant) -> usize {
        self.chain.pin(ids, until)
    }

    /// Removes `id` and its descendants. The result lists descendants before
    /// ancestors, so unlinking in order never leaves a child without its parent.
    pub fn remove_cascade(&mut self, id: &BlockId) -> Vec<Removed> {
        removed(self.chain.remove_cascade(id))
    }

    /// Checks byte accounting, the leaf set and the parent/child links.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.chain.check_invariants()
    }
}
