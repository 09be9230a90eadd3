//! The memory tier: a byte budget, eviction that keeps chains prefix-closed,
//! TTLs and pins.
//!
//! The bookkeeping (chain links, leaf LRU, expiry, orphans, pins) is the
//! [`crate::chain_index::ChainIndex`] the disk tier uses too, holding whole
//! blocks here. Only *leaves* (blocks none of whose children are resident) are
//! eviction candidates, least recently used first, so a chain is always eaten
//! from its tail; removing a block for any other reason (delete, TTL) removes
//! its resident descendants too. Together these keep the resident set
//! prefix-closed. When the tier is full the victim's tenant is the one most
//! over its capacity share ([`crate::shares`]).
//!
//! Why hand-written and not moka / foyer / quick_cache: see `docs/cache-choice.md`
//! (none of them can restrict eviction to chain leaves or pin by lease).
use crate::block::{Block, BlockId};
use crate::chain_index::{ChainIndex, Found, Node};
use crate::error::{Error, Result};
use crate::keys::Key;
use crate::shares::{ShareStat, Shares};
use crate::tier::{PutOutcome, Tier, TierKind, TierStats};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Bytes charged per entry on top of its payload (map entry, key, metadata), so
/// that millions of tiny key/value entries cannot blow through the budget.
pub const ENTRY_OVERHEAD: u64 = 160;

pub use crate::clock::unix_ms;
pub use crate::tier::Overwrite;

impl Node for Block {
    fn cost(&self) -> u64 {
        cost_of(self)
    }
    fn parent(&self) -> Option<&Key> {
        self.meta.parent.as_ref()
    }
}

fn cost_of(b: &Block) -> u64 {
    b.payload.len() as u64 + b.meta.id.key.as_bytes().len() as u64 + ENTRY_OVERHEAD
}

/// Blocks by id, in the shared chain index; expiry on tokio's clock.
type Inner = ChainIndex<Block, Instant>;

/// The memory tier. See the module docs.
pub struct MemoryTier {
    capacity: u64,
    inner: Mutex<Inner>,
}

impl MemoryTier {
    /// A tier holding at most `capacity` bytes (payload + per-entry overhead),
    /// divided between tenants by the default [`Shares`].
    pub fn new(capacity: u64) -> Self {
        Self::with_shares(capacity, Arc::new(Shares::default()))
    }

    /// A tier holding at most `capacity` bytes, divided per `shares`.
    pub fn with_shares(capacity: u64, shares: Arc<Shares>) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::new(shares)),
        }
    }

    /// Resident bytes and evictions per share label.
    pub fn share_stats(&self) -> Vec<ShareStat> {
        self.inner.lock().share_stats()
    }

    /// Reports every later residency change to `o` (`crate::events`).
    pub(crate) fn observe(&self, o: crate::chain_index::Observer) {
        self.inner.lock().observe(o);
    }

    /// The byte budget.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Looks a block up, counting a hit or miss and refreshing its recency.
    pub fn get_block(&self, id: &BlockId) -> Option<Block> {
        let mut g = self.inner.lock();
        let found = match g.lookup(id, Instant::now(), true) {
            Found::Live(b) => Some(b.clone()),
            Found::Missing | Found::Expired(_) => None,
        };
        if found.is_some() {
            g.counters.hits += 1
        } else {
            g.counters.misses += 1
        }
        found
    }

    /// True when present (refreshes recency; counts no hit/miss).
    pub fn contains_block(&self, id: &BlockId) -> bool {
        let mut g = self.inner.lock();
        matches!(g.lookup(id, Instant::now(), true), Found::Live(_))
    }

    /// Stores a block. See [`Overwrite`].
    pub fn put_block(&self, block: Block, overwrite: Overwrite) -> Result<PutOutcome> {
        self.put_block_evicting(block, overwrite)
            .map(|(outcome, _)| outcome)
    }

    /// Stores a block like [`MemoryTier::put_block`] and hands back the blocks
    /// evicted to make room (LRU leaves), so the caller can demote them to a
    /// lower tier outside the lock. Expired blocks are not handed back.
    pub fn put_block_evicting(
        &self,
        block: Block,
        overwrite: Overwrite,
    ) -> Result<(PutOutcome, Vec<Block>)> {
        let cost = cost_of(&block);
        if cost > self.capacity {
            return Err(Error::exhausted(format!(
                "block of {} bytes does not fit in the memory tier ({} bytes)",
                block.payload.len(),
                self.capacity
            )));
        }
        let now = Instant::now();
        let mut g = self.inner.lock();
        g.purge_expired(now);
        let id = block.meta.id.clone();
        let same = match g.lookup(&id, now, true) {
            Found::Live(e) => Some(
                e.meta.crc32c == block.meta.crc32c
                    && e.meta.parent == block.meta.parent
                    && e.payload == block.payload,
            ),
            Found::Missing | Found::Expired(_) => None,
        };
        if let Some(same) = same {
            if same {
                return Ok((PutOutcome::Existing, Vec::new()));
            }
            match overwrite {
                Overwrite::Never => {
                    return Err(Error::precondition(format!(
                        "key {:?} already holds a different block; blocks are immutable",
                        id.key
                    )));
                }
                Overwrite::Replace => {
                    g.remove_cascade(&id);
                }
            }
        }
        let expires_at = block
            .meta
            .expires_unix_ms
            .map(|exp| now + Duration::from_millis(exp.saturating_sub(unix_ms())));
        g.insert(id.clone(), block, expires_at);
        let capacity = self.capacity;
        let writer = Some((&id.namespace, 0));
        match g.evict_until(|bytes| bytes <= capacity, Some(&id), writer, now) {
            Ok(evicted) => Ok((
                PutOutcome::Stored,
                evicted.into_iter().map(|(_, b)| b).collect(),
            )),
            Err(evicted) => {
                // A failed put changes nothing: its block leaves, and what
                // was evicted for it comes back (it fitted before, so it
                // fits again). Dropping it instead would lose blocks that,
                // under disk write-back, exist nowhere else.
                let pinned = g.pinned_bytes(now);
                g.remove_cascade(&id);
                let own = g.group_bytes(&id.namespace);
                g.counters.evictions -= evicted.len() as u64;
                for (bid, b) in evicted.into_iter().rev() {
                    let expires_at = b
                        .meta
                        .expires_unix_ms
                        .map(|exp| now + Duration::from_millis(exp.saturating_sub(unix_ms())));
                    g.insert(bid, b, expires_at);
                }
                debug_assert!(g.bytes() <= capacity);
                let why = if pinned > capacity / 2 {
                    format!("{pinned} of {capacity} bytes are pinned by leases")
                } else if own < g.bytes() {
                    format!(
                        "namespace {} is at its capacity share ({own} of {capacity} bytes; \
                         the rest is other tenants' share and this block's own ancestors, \
                         docs/security.md)",
                        id.namespace
                    )
                } else {
                    "the rest of memory holds this block's own ancestors (the chain is longer \
                     than the memory tier; raise --memory-capacity or add a disk tier)"
                        .to_string()
                };
                Err(Error::exhausted(format!(
                    "memory tier full, block not stored: {why}"
                )))
            }
        }
    }

    /// Removes a block and its resident descendants; returns how many.
    pub fn remove(&self, id: &BlockId) -> u64 {
        self.inner.lock().remove_cascade(id).len() as u64
    }

    /// Pins resident blocks until `until`; returns how many were resident.
    pub fn pin(&self, ids: &[BlockId], until: Instant) -> usize {
        self.inner.lock().pin(ids, until)
    }

    /// What pinning `ids` in order holds here, per id (see
    /// [`crate::lease::chain_costs`]).
    pub fn pin_costs(&self, ids: &[BlockId]) -> Vec<u64> {
        self.inner.lock().pin_costs(ids)
    }

    /// Lifts the pins that end exactly at `until` (placed by the lease being
    /// released; a pin a later lease extended ends later and stays).
    pub fn unpin(&self, ids: &[BlockId], until: Instant) {
        self.inner.lock().unpin(ids, until)
    }

    /// Counters (same as [`Tier::stats`], without the async trait).
    pub fn stats_snapshot(&self) -> TierStats {
        Tier::stats(self)
    }

    /// Removes every expired block now; returns how many.
    pub fn purge_expired(&self) -> u64 {
        self.inner.lock().purge_expired(Instant::now()).len() as u64
    }

    /// Checks the structural invariants (used by tests): byte accounting, the
    /// leaf set, and the chain links (see
    /// [`crate::chain_index::ChainIndex::check_invariants`]).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.lock().check_invariants()
    }
}

#[async_trait]
impl Tier for MemoryTier {
    fn kind(&self) -> TierKind {
        TierKind::Memory
    }
    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        Ok(self.get_block(id))
    }
    async fn contains(&self, id: &BlockId) -> Result<bool> {
        Ok(self.contains_block(id))
    }
    async fn put(&self, block: Block) -> Result<PutOutcome> {
        self.put_block(block, Overwrite::Never)
    }
    async fn delete(&self, id: &BlockId) -> Result<u64> {
        Ok(self.remove(id))
    }
    fn stats(&self) -> TierStats {
        let g = self.inner.lock();
        let c = g.counters;
        TierStats {
            blocks: g.len() as u64,
            bytes: g.bytes(),
            capacity_bytes: self.capacity,
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
            expirations: c.expirations,
        }
    }
}
