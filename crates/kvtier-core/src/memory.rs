//! The memory tier: a byte budget, eviction that keeps chains prefix-closed,
//! TTLs and pins.
//!
//! ```text
//!   map: BlockId -> Entry { block, tick, children, pinned_until, expires_at }
//!   leaves:  tick -> BlockId      (blocks with no resident child, LRU order)
//!   expiry:  (instant, tick) -> BlockId
//!   orphans: parent BlockId -> [child keys]  (children written before their parent)
//! ```
//!
//! Only *leaves* (blocks none of whose children are resident) are eviction
//! candidates, least recently used first, so a chain is always eaten from its
//! tail: a parent is never evicted while one of its children is resident.
//! Removing a block for any other reason (delete, TTL) removes its resident
//! descendants too. Together these keep the resident set prefix-closed.
//!
//! Why hand-written and not moka / foyer / quick_cache: see `docs/cache-choice.md`
//! (none of them can restrict eviction to chain leaves or pin by lease).
use crate::block::{Block, BlockId};
use crate::error::{Error, Result};
use crate::keys::Key;
use crate::tier::{PutOutcome, Tier, TierKind, TierStats};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Bytes charged per entry on top of its payload (map entry, key, metadata), so
/// that millions of tiny key/value entries cannot blow through the budget.
pub const ENTRY_OVERHEAD: u64 = 160;

/// Current Unix time in milliseconds.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct Entry {
    block: Block,
    /// Last access; also this entry's position in `leaves` while it is a leaf.
    tick: u64,
    /// Keys of resident children (same namespace).
    children: Vec<Key>,
    pinned_until: Option<Instant>,
    /// Position in `expiry`, if the block has a TTL.
    expiry: Option<(Instant, u64)>,
}

impl Entry {
    fn cost(&self) -> u64 {
        cost_of(&self.block)
    }
    fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }
    fn pinned(&self, now: Instant) -> bool {
        self.pinned_until.is_some_and(|p| p > now)
    }
}

fn cost_of(b: &Block) -> u64 {
    b.payload.len() as u64 + b.meta.id.key.as_bytes().len() as u64 + ENTRY_OVERHEAD
}

#[derive(Default)]
struct Inner {
    map: HashMap<BlockId, Entry>,
    leaves: BTreeMap<u64, BlockId>,
    expiry: BTreeMap<(Instant, u64), BlockId>,
    orphans: HashMap<BlockId, Vec<Key>>,
    bytes: u64,
    tick: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    expirations: u64,
}

/// How a put treats an existing block under the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Blocks are immutable: an identical re-write is a no-op, a different
    /// payload under the same key is rejected.
    Never,
    /// Key/value semantics: replace the old value (and drop its descendants).
    Replace,
}

/// The memory tier. See the module docs.
pub struct MemoryTier {
    capacity: u64,
    inner: Mutex<Inner>,
}

impl MemoryTier {
    /// A tier holding at most `capacity` bytes (payload + per-entry overhead).
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The byte budget.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Looks a block up, counting a hit or miss and refreshing its recency.
    pub fn get_block(&self, id: &BlockId) -> Option<Block> {
        let mut g = self.inner.lock();
        let now = Instant::now();
        let found = g.touch(id, now).map(|e| e.block.clone());
        if found.is_some() {
            g.hits += 1
        } else {
            g.misses += 1
        }
        found
    }

    /// True when present (refreshes recency; counts no hit/miss).
    pub fn contains_block(&self, id: &BlockId) -> bool {
        let mut g = self.inner.lock();
        g.touch(id, Instant::now()).is_some()
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
        let mut guard = self.inner.lock();
        let g = &mut *guard;
        g.purge_expired(now);
        let id = block.meta.id.clone();
        let same = g.touch(&id, now).map(|e| {
            e.block.meta.crc32c == block.meta.crc32c
                && e.block.meta.parent == block.meta.parent
                && e.block.payload == block.payload
        });
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
        g.tick += 1;
        let tick = g.tick;
        let children = g.orphans.remove(&id).unwrap_or_default();
        let expiry = expires_at.map(|t| (t, tick));
        if let Some(k) = expiry {
            g.expiry.insert(k, id.clone());
        }
        if let Some(parent) = block.meta.parent.clone() {
            let pid = BlockId::new(id.namespace.clone(), parent);
            match g.map.get_mut(&pid) {
                Some(p) => {
                    if p.is_leaf() {
                        let t = p.tick;
                        p.children.push(id.key.clone());
                        g.leaves.remove(&t);
                    } else {
                        p.children.push(id.key.clone());
                    }
                }
                None => g.orphans.entry(pid).or_default().push(id.key.clone()),
            }
        }
        let entry = Entry {
            block,
            tick,
            children,
            pinned_until: None,
            expiry,
        };
        if entry.is_leaf() {
            g.leaves.insert(tick, id.clone());
        }
        g.map.insert(id.clone(), entry);
        g.bytes += cost;
        let mut evicted = Vec::new();
        if !g.evict_to(self.capacity, now, &id, &mut evicted) {
            let pinned: u64 = g
                .map
                .values()
                .filter(|e| e.pinned(now))
                .map(Entry::cost)
                .sum();
            g.remove_cascade(&id);
            let why = if pinned > self.capacity / 2 {
                format!("{pinned} of {} bytes are pinned by leases", self.capacity)
            } else {
                "the rest of memory holds this block's own ancestors (the chain is longer than the \
                 memory tier; raise --memory-capacity or add a disk tier)"
                    .to_string()
            };
            return Err(Error::exhausted(format!(
                "memory tier full, block not stored: {why}"
            )));
        }
        Ok((PutOutcome::Stored, evicted))
    }

    /// Removes a block and its resident descendants; returns how many.
    pub fn remove(&self, id: &BlockId) -> u64 {
        self.inner.lock().remove_cascade(id)
    }

    /// Pins resident blocks until `until`; returns how many were resident.
    pub fn pin(&self, ids: &[BlockId], until: Instant) -> usize {
        let mut guard = self.inner.lock();
        let g = &mut *guard;
        let mut n = 0;
        for id in ids {
            if let Some(e) = g.map.get_mut(id) {
                e.pinned_until = Some(e.pinned_until.map_or(until, |p| p.max(until)));
                n += 1;
            }
        }
        n
    }

    /// What pinning `ids` in order holds here, per id (see
    /// [`crate::lease::chain_costs`]).
    pub fn pin_costs(&self, ids: &[BlockId]) -> Vec<u64> {
        let g = self.inner.lock();
        crate::lease::chain_costs(ids, |id| {
            g.map
                .get(id)
                .map(|e| (e.cost(), e.block.meta.parent.clone()))
        })
    }

    /// Lifts the pins that end exactly at `until` (placed by the lease being
    /// released; a pin a later lease extended ends later and stays).
    pub fn unpin(&self, ids: &[BlockId], until: Instant) {
        let mut g = self.inner.lock();
        for id in ids {
            if let Some(e) = g.map.get_mut(id)
                && e.pinned_until == Some(until)
            {
                e.pinned_until = None;
            }
        }
    }

    /// Counters (same as [`Tier::stats`], without the async trait).
    pub fn stats_snapshot(&self) -> TierStats {
        Tier::stats(self)
    }

    /// Removes every expired block now; returns how many.
    pub fn purge_expired(&self) -> u64 {
        self.inner.lock().purge_expired(Instant::now())
    }

    /// Checks the structural invariants (used by tests): byte accounting, the
    /// leaf set, and prefix closure (every resident block's parent, if it was
    /// ever linked, is resident).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let g = self.inner.lock();
        let bytes: u64 = g.map.values().map(Entry::cost).sum();
        if bytes != g.bytes {
            return Err(format!("byte count {} != sum {}", g.bytes, bytes));
        }
        for (id, e) in &g.map {
            let in_leaves = g.leaves.get(&e.tick) == Some(id);
            if e.is_leaf() != in_leaves {
                return Err(format!(
                    "{id:?}: leaf={} in_leaves={in_leaves}",
                    e.is_leaf()
                ));
            }
            for c in &e.children {
                let cid = BlockId::new(id.namespace.clone(), c.clone());
                match g.map.get(&cid) {
                    Some(ch) if ch.block.meta.parent.as_ref() == Some(&id.key) => {}
                    _ => return Err(format!("{id:?} lists non-resident child {c:?}")),
                }
            }
            if let Some(p) = &e.block.meta.parent {
                let pid = BlockId::new(id.namespace.clone(), p.clone());
                let linked = g
                    .map
                    .get(&pid)
                    .is_some_and(|pe| pe.children.contains(&id.key));
                let orphan = g.orphans.get(&pid).is_some_and(|o| o.contains(&id.key));
                if linked == orphan {
                    return Err(format!("{id:?}: linked={linked} orphan={orphan}"));
                }
            }
        }
        if g.leaves.len() > g.map.len() {
            return Err("stale leaves".into());
        }
        Ok(())
    }
}

impl Inner {
    /// Refreshes recency of a live entry; removes it if expired.
    fn touch(&mut self, id: &BlockId, now: Instant) -> Option<&Entry> {
        let expired = match self.map.get(id) {
            None => return None,
            Some(e) => e.expiry.is_some_and(|(t, _)| t <= now),
        };
        if expired {
            self.expirations += self.remove_cascade(id);
            return None;
        }
        self.tick += 1;
        let tick = self.tick;
        let e = self.map.get_mut(id)?;
        let old = std::mem::replace(&mut e.tick, tick);
        if e.is_leaf() {
            self.leaves.remove(&old);
            self.leaves.insert(tick, id.clone());
        }
        self.map.get(id)
    }

    fn purge_expired(&mut self, now: Instant) -> u64 {
        let mut n = 0;
        while let Some((&(t, _), _)) = self.expiry.first_key_value() {
            if t > now {
                break;
            }
            let (_, id) = self.expiry.pop_first().expect("non-empty");
            n += self.remove_cascade(&id);
        }
        self.expirations += n;
        n
    }

    /// Evicts LRU unpinned leaves (never `keep`) until within `capacity`,
    /// appending them to `evicted`. Returns false if that is impossible (the
    /// blocks evicted so far stay evicted and are still reported).
    fn evict_to(
        &mut self,
        capacity: u64,
        now: Instant,
        keep: &BlockId,
        evicted: &mut Vec<Block>,
    ) -> bool {
        if self.bytes <= capacity {
            return true;
        }
        self.purge_expired(now);
        while self.bytes > capacity {
            // Scan leaves oldest first, skipping pinned ones. Removing a leaf may
            // turn its parent into a leaf with an older tick, so rescan each time.
            let victim = self
                .leaves
                .values()
                .find(|id| *id != keep && !self.map.get(*id).is_some_and(|e| e.pinned(now)))
                .cloned();
            let Some(id) = victim else { return false };
            if let Some(e) = self.map.get(&id) {
                evicted.push(e.block.clone());
            }
            self.remove_cascade(&id);
            self.evictions += 1;
        }
        true
    }

    /// Removes `id` and its resident descendants, keeping every index consistent.
    fn remove_cascade(&mut self, id: &BlockId) -> u64 {
        let mut stack = vec![id.clone()];
        let mut removed = 0;
        while let Some(cur) = stack.pop() {
            let Some(e) = self.map.remove(&cur) else {
                continue;
            };
            removed += 1;
            self.bytes -= e.cost();
            if e.is_leaf() {
                self.leaves.remove(&e.tick);
            }
            if let Some(k) = e.expiry {
                self.expiry.remove(&k);
            }
            for c in &e.children {
                stack.push(BlockId::new(cur.namespace.clone(), c.clone()));
            }
            // Children we pushed are removed below us; unlink from our parent
            // only if the parent stays (it is not part of this cascade).
            if let Some(p) = &e.block.meta.parent {
                let pid = BlockId::new(cur.namespace.clone(), p.clone());
                if let Some(pe) = self.map.get_mut(&pid) {
                    pe.children.retain(|k| k != &cur.key);
                    if pe.children.is_empty() {
                        let t = pe.tick;
                        self.leaves.insert(t, pid);
                    }
                } else if let Some(o) = self.orphans.get_mut(&pid) {
                    o.retain(|k| k != &cur.key);
                    if o.is_empty() {
                        self.orphans.remove(&pid);
                    }
                }
            }
        }
        removed
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
        TierStats {
            blocks: g.map.len() as u64,
            bytes: g.bytes,
            capacity_bytes: self.capacity,
            hits: g.hits,
            misses: g.misses,
            evictions: g.evictions,
            expirations: g.expirations,
        }
    }
}
