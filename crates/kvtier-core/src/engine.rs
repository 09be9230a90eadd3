//! The engine: one store over three named tier slots.
//!
//! The slots are memory (always), disk (optional) and the shared object store
//! (optional), built with [`Engine::builder`]. They are named rather than a
//! list of `dyn Tier` because each one plays a different part in a write:
//! memory evicts and demotes, the disk is written through or back per
//! [`WritePolicy`], and the object store is written first (write-through) or
//! queued (write-back) and asked in parallel on lookups. A list would need a
//! role per entry, which is what a name is. Every slot implements [`Tier`],
//! and reads, deletes and stats go through that trait.
//!
//! Reads walk the slots top to bottom and promote what they find into memory;
//! lookups walk a chain of keys and stop at the first key no tier has. Every
//! call reports how long it spent in each tier, which the fronts return to
//! clients as server timing.
//!
//! With a disk tier ([`EngineBuilder::disk`]) writes follow a [`WritePolicy`]:
//!
//! * [`WritePolicy::WriteThrough`] (the default): every write goes to memory
//!   *and* disk before it is acknowledged, so under `--disk-sync always` an
//!   acknowledged write is durable; memory is a cache in front of the disk.
//! * [`WritePolicy::WriteBack`]: writes go to memory only; blocks reach the
//!   disk when memory evicts them (demotion). Faster writes, nothing durable
//!   until demoted.
//!
//! In both, blocks memory evicts that the disk does not hold are demoted to
//! it, and disk hits are promoted to memory. A disk write that fails under
//! `batch` / `never` sync degrades to memory-only (counted in
//! [`EngineStats::degraded_writes`]); under `always` it fails the write.
//! See `docs/durability.md`.
use crate::block::{Block, BlockId};
use crate::disk::{DiskTier, SyncMode};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{DEFAULT_BLOCK_SIZE, HashFn, Key, Namespace};
use crate::lease::{LeaseGrant, LeaseTable};
use crate::memory::{MemoryTier, Overwrite};
use crate::object_link::{ObjectLink, ObjectOptions, ObjectStats, ObjectWritePolicy};
use crate::size::ByteSize;
use crate::tier::{PutOutcome, Tier, TierKind, TierStats};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Engine settings (the `[engine]` section of the server config).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Memory-tier byte budget.
    pub memory_capacity: ByteSize,
    /// Largest payload accepted for one block or value.
    pub max_block_size: ByteSize,
    /// Tokens per block when a request does not say.
    pub default_block_size: usize,
    /// Longest lease granted; longer requests are clamped.
    pub max_lease: Duration,
    /// Bytes all leases together may pin (a pinned block and the ancestors it
    /// keeps); 0 = half the memory tier, so pins can never leave writers
    /// without room.
    pub max_pinned: ByteSize,
    /// Bytes the leases of one namespace may pin; 0 = `max_pinned`.
    pub max_pinned_per_namespace: ByteSize,
}

impl EngineConfig {
    /// The pin caps, with 0s resolved to their defaults.
    pub fn pin_budget(&self) -> crate::lease::PinBudget {
        let total = match self.max_pinned.bytes() {
            0 => self.memory_capacity.bytes() / 2,
            n => n,
        };
        let per_namespace = match self.max_pinned_per_namespace.bytes() {
            0 => total,
            n => n.min(total),
        };
        crate::lease::PinBudget {
            total,
            per_namespace,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            memory_capacity: ByteSize::gib(2),
            max_block_size: ByteSize::mib(64),
            default_block_size: DEFAULT_BLOCK_SIZE,
            max_lease: Duration::from_secs(60),
            max_pinned: ByteSize(0),
            max_pinned_per_namespace: ByteSize(0),
        }
    }
}

/// Time spent inside each tier during one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageTiming {
    /// Inside the memory tier.
    pub memory: Duration,
    /// Inside the disk tier.
    pub disk: Duration,
    /// Inside the object-store tier.
    pub object: Duration,
}

impl StorageTiming {
    /// Adds `d` to the tier `kind`.
    pub fn add(&mut self, kind: TierKind, d: Duration) {
        match kind {
            TierKind::Memory => self.memory += d,
            TierKind::Disk => self.disk += d,
            TierKind::Object => self.object += d,
        }
    }
    /// Sum over tiers.
    pub fn total(&self) -> Duration {
        self.memory + self.disk + self.object
    }
}

/// Result of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOutcome {
    /// Leading keys present.
    pub found: usize,
    /// Tier of each found key.
    pub tiers: Vec<TierKind>,
    /// Lease on the found prefix, when one was asked for and something was found.
    pub lease: Option<LeaseGrant>,
}

/// Result of a write: the tiers' own [`PutOutcome`] (newly stored, or an
/// identical block was already there).
pub type WriteOutcome = PutOutcome;

/// Engine-wide counters.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    /// Per tier, top first.
    pub tiers: Vec<(TierKind, TierStats)>,
    /// Leases currently active.
    pub active_leases: u64,
    /// Bytes leases pin now (charged against `engine.max_pinned`).
    pub pinned_bytes: u64,
    /// Leases cut short or refused by the pin caps.
    pub lease_refusals: u64,
    /// Writes acknowledged although the disk tier refused them (memory only).
    pub degraded_writes: u64,
    /// Blocks evicted from memory and written to disk.
    pub demotions: u64,
    /// Demotions that failed (the block was dropped).
    pub demotion_failures: u64,
    /// Object-store tier counters, when one is configured.
    pub object: Option<ObjectStats>,
}

/// How writes reach the disk tier. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WritePolicy {
    /// Write to memory and disk before acknowledging (the default).
    #[default]
    WriteThrough,
    /// Write to memory; demote to disk on eviction.
    WriteBack,
}

#[derive(Default)]
struct Counters {
    degraded_writes: AtomicU64,
    demotions: AtomicU64,
    demotion_failures: AtomicU64,
    lease_refusals: AtomicU64,
}

/// The store. Cheap to share behind an `Arc`.
pub struct Engine {
    cfg: EngineConfig,
    memory: Arc<MemoryTier>,
    /// The disk tier, if configured.
    disk: Option<Arc<DiskTier>>,
    policy: WritePolicy,
    leases: LeaseTable,
    counters: Counters,
    /// Blocks whose write-through to the disk tier is in progress (with a count
    /// of concurrent writers): memory may evict them before that write lands,
    /// and demoting them then would write the same record twice (and report
    /// the caller's fresh write as `Existing`).
    writing: parking_lot::Mutex<std::collections::HashMap<BlockId, usize>>,
    /// The object-store tier, if configured.
    object: Option<ObjectLink>,
}

/// Builds an [`Engine`]: memory, then optionally a disk and an object store.
pub struct EngineBuilder {
    cfg: EngineConfig,
    disk: Option<(Arc<DiskTier>, WritePolicy)>,
    object: Option<(Arc<dyn Tier>, ObjectOptions)>,
}

impl EngineBuilder {
    /// A disk tier (opened with [`DiskTier::open`]) below memory, written per
    /// `policy`; `None` leaves the slot empty.
    pub fn disk(mut self, disk: Option<Arc<DiskTier>>, policy: WritePolicy) -> Self {
        self.disk = disk.map(|d| (d, policy));
        self
    }

    /// The shared object store (any [`Tier`]) below the local tiers: reads
    /// fall through to it, lookups ask it for keys no local tier has, writes
    /// reach it per [`ObjectOptions::policy`]. See `docs/object-store.md`.
    pub fn object(mut self, tier: Arc<dyn Tier>, opts: ObjectOptions) -> Self {
        self.object = Some((tier, opts));
        self
    }

    /// The engine. Must run inside a Tokio runtime when an object store with
    /// write-back is configured (its uploader starts here).
    pub fn build(self) -> Engine {
        let memory = Arc::new(MemoryTier::new(self.cfg.memory_capacity.bytes()));
        let leases = LeaseTable::new(self.cfg.pin_budget());
        let (disk, policy) = match self.disk {
            Some((d, p)) => (Some(d), p),
            None => (None, WritePolicy::default()),
        };
        Engine {
            cfg: self.cfg,
            memory,
            disk,
            policy,
            leases,
            counters: Counters::default(),
            writing: Default::default(),
            object: self.object.map(|(t, o)| ObjectLink::new(t, o)),
        }
    }
}

impl Engine {
    /// A builder for an engine with `cfg`; memory only unless told otherwise.
    pub fn builder(cfg: EngineConfig) -> EngineBuilder {
        EngineBuilder {
            cfg,
            disk: None,
            object: None,
        }
    }

    /// An engine with only the memory tier.
    pub fn new(cfg: EngineConfig) -> Self {
        Self::builder(cfg).build()
    }

    /// The local tiers below memory (the disk, when there is one).
    fn below_memory(&self) -> impl Iterator<Item = &dyn Tier> {
        self.disk.iter().map(|d| &**d as &dyn Tier)
    }

    /// Every tier below memory, the object store last.
    fn lower(&self) -> impl Iterator<Item = &dyn Tier> {
        self.below_memory()
            .chain(self.object.iter().map(|o| &*o.tier as &dyn Tier))
    }

    /// Waits until write-back has uploaded every queued block; false when
    /// `timeout` passed first. True at once without write-back.
    pub async fn flush_object_uploads(&self, timeout: Duration) -> bool {
        match self.object.as_ref().and_then(|o| o.writeback.as_ref()) {
            Some(wb) => wb.flush(timeout).await,
            None => true,
        }
    }

    /// True when an object-store tier is configured.
    pub fn has_object_tier(&self) -> bool {
        self.object.is_some()
    }

    /// The disk tier, if configured.
    pub fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.disk.as_ref()
    }

    /// The write policy towards the disk tier.
    pub fn write_policy(&self) -> WritePolicy {
        self.policy
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The memory tier (for tests and maintenance tasks).
    pub fn memory(&self) -> &MemoryTier {
        &self.memory
    }

    /// Computes chain keys from tokens (`block_size` 0 = default; only full blocks).
    pub fn keys_for_tokens(
        &self,
        tokens: &[u32],
        block_size: usize,
        hash: HashFn,
    ) -> Result<Vec<Key>> {
        let bs = if block_size == 0 {
            self.cfg.default_block_size
        } else {
            block_size
        };
        hash.chain(tokens, bs)
    }

    /// Counts the leading `keys` present in any tier, optionally pinning them.
    pub async fn lookup(
        &self,
        ns: &Namespace,
        keys: &[Key],
        lease: Option<Duration>,
        timing: &mut StorageTiming,
    ) -> Result<LookupOutcome> {
        let mut tiers = Vec::with_capacity(keys.len());
        let mut ids = Vec::with_capacity(keys.len());
        for key in keys {
            let id = BlockId::new(ns.clone(), key.clone());
            let t0 = Instant::now();
            let in_mem = self.memory.contains_block(&id);
            timing.add(TierKind::Memory, t0.elapsed());
            let tier = if in_mem {
                Some(TierKind::Memory)
            } else {
                let mut found = None;
                for t in self.below_memory() {
                    let t0 = Instant::now();
                    let hit = t.contains(&id).await;
                    timing.add(t.kind(), t0.elapsed());
                    if hit? {
                        found = Some(t.kind());
                        break;
                    }
                }
                found
            };
            match tier {
                Some(t) => {
                    tiers.push(t);
                    ids.push(id);
                }
                None => break,
            }
        }
        if let Some(obj) = &self.object
            && ids.len() < keys.len()
        {
            let t0 = Instant::now();
            let n = obj
                .lookup(ns, &keys[ids.len()..], |id: &BlockId| self.held_locally(id))
                .await;
            timing.add(TierKind::Object, t0.elapsed());
            for key in &keys[ids.len()..ids.len() + n] {
                tiers.push(TierKind::Object);
                ids.push(BlockId::new(ns.clone(), key.clone()));
            }
        }
        // A lease covers as much of the prefix as the pin budget allows, and
        // only that much is reported found: the client reads what is pinned
        // and computes the rest.
        let lease = match lease {
            Some(d) if !ids.is_empty() => match self.pin(&ids, d, true)? {
                Some((grant, n)) => {
                    tiers.truncate(n);
                    Some(grant)
                }
                None => {
                    tiers.clear();
                    None
                }
            },
            _ => None,
        };
        Ok(LookupOutcome {
            found: tiers.len(),
            tiers,
            lease,
        })
    }

    /// Pins explicit keys; every key must be present (in memory or on disk).
    pub fn lease(&self, ns: &Namespace, keys: &[Key], dur: Duration) -> Result<LeaseGrant> {
        if keys.is_empty() {
            return Err(Error::invalid("lease needs at least one key"));
        }
        let ids: Vec<BlockId> = keys
            .iter()
            .map(|k| BlockId::new(ns.clone(), k.clone()))
            .collect();
        for id in &ids {
            if !self.held_locally(id) {
                return Err(Error::not_found(format!(
                    "cannot lease key {:?} in namespace {}: not present",
                    id.key, id.namespace
                )));
            }
        }
        match self.pin(&ids, dur, false)? {
            Some((grant, _)) => Ok(grant),
            None => Err(Error::exhausted("nothing to pin")),
        }
    }

    /// Pins the leading `ids` that fit the pin budget (all of them or an
    /// error unless `partial`) under one lease; `None` when none fit.
    fn pin(
        &self,
        ids: &[BlockId],
        dur: Duration,
        partial: bool,
    ) -> Result<Option<(LeaseGrant, usize)>> {
        if dur.is_zero() {
            return Err(Error::invalid("lease duration must be > 0 ms"));
        }
        let dur = dur.min(self.cfg.max_lease);
        // A block is pinned in memory and on disk; the larger of the two is
        // charged (the budget is the memory tier's, and disks are larger).
        let mut costs = self.memory.pin_costs(ids);
        if let Some(d) = &self.disk {
            for (c, d) in costs.iter_mut().zip(d.pin_costs(ids)) {
                *c = (*c).max(d);
            }
        }
        let (lease_id, n, until) = self.leases.charge(ids, &costs, dur);
        if n < ids.len() && !partial {
            // Refused whole: what was reserved for the leading blocks goes back.
            self.leases.refund(lease_id, until);
            let budget = self.leases.budget();
            let (total, mine) = self.leases.pinned_bytes(&ids[0].namespace);
            return Err(Error::exhausted(format!(
                "pinning these {} blocks needs {} bytes; leases pin {mine} of {} bytes allowed \
                 for namespace {} and {total} of {} in all (engine.max_pinned_per_namespace, \
                 engine.max_pinned); release leases or lease fewer blocks",
                ids.len(),
                costs.iter().sum::<u64>(),
                budget.per_namespace,
                ids[0].namespace,
                budget.total
            )));
        }
        if n == 0 {
            self.counters.lease_refusals.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        if n < ids.len() {
            self.counters.lease_refusals.fetch_add(1, Ordering::Relaxed);
        }
        let ids = &ids[..n];
        let grant = match self.leases.grant(lease_id, ids, until) {
            Ok(g) => g,
            Err(e) => {
                // Too many leases: nothing is pinned, so nothing stays charged.
                self.leases.refund(lease_id, until);
                return Err(e);
            }
        };
        self.memory.pin(ids, grant.expires_at);
        if let Some(d) = &self.disk {
            d.pin(ids, grant.expires_at);
        }
        Ok(Some((grant, n)))
    }

    /// Fails unless lease `id` is active.
    pub fn check_lease(&self, id: u64) -> Result<()> {
        self.leases.check(id)
    }

    /// Namespace of active lease `id`, if it is active.
    pub fn lease_namespace(&self, id: u64) -> Option<Namespace> {
        self.leases.namespace_of(id)
    }

    /// Ends a lease early: its pin charge is given back and the pins it
    /// placed are lifted (where a later lease extended a pin, that one
    /// stays; a block pinned by an earlier-ending lease as well loses its pin
    /// too, which can only turn that lease's read into a miss, never into
    /// wrong data).
    pub fn release_lease(&self, id: u64) -> Result<()> {
        let (ids, until) = self.leases.release(id)?;
        self.memory.unpin(&ids, until);
        if let Some(d) = &self.disk {
            d.unpin(&ids, until);
        }
        Ok(())
    }

    /// Reads one block from the highest tier that has it, promoting it to memory.
    pub async fn read(
        &self,
        id: &BlockId,
        timing: &mut StorageTiming,
    ) -> Result<Option<(Block, TierKind)>> {
        let t0 = Instant::now();
        let hit = self.memory.get_block(id);
        timing.add(TierKind::Memory, t0.elapsed());
        if let Some(b) = hit {
            return Ok(Some((b, TierKind::Memory)));
        }
        for t in self.lower() {
            let t0 = Instant::now();
            let got = t.get(id).await;
            timing.add(t.kind(), t0.elapsed());
            if let Some(b) = got? {
                let t0 = Instant::now();
                // Promotion is best effort: a full memory tier must not fail the read.
                let evicted = self.memory.put_block_evicting(b.clone(), Overwrite::Never);
                timing.add(TierKind::Memory, t0.elapsed());
                if let Ok((_, evicted)) = evicted {
                    self.demote(evicted, timing).await;
                }
                if t.kind() == TierKind::Object {
                    self.promote_to_disk(&b);
                }
                return Ok(Some((b, t.kind())));
            }
        }
        Ok(None)
    }

    /// Validates and stores a block (immutable semantics).
    pub async fn write(&self, block: Block, timing: &mut StorageTiming) -> Result<WriteOutcome> {
        self.store(block, Overwrite::Never, timing).await
    }

    /// Stores a key/value entry, replacing any previous value.
    pub async fn put_value(
        &self,
        block: Block,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        self.store(block, Overwrite::Replace, timing).await
    }

    async fn store(
        &self,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        match &self.object {
            None => self.store_local(block, mode, timing).await,
            Some(obj) => self.store_with_object(obj, block, mode, timing).await,
        }
    }

    /// The object-store step around [`Engine::store_local`]; see `docs/object-store.md`.
    async fn store_with_object(
        &self,
        obj: &ObjectLink,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        self.check_size(block.payload.len())?;
        let id = block.meta.id.clone();
        let locally_known = self.held_locally(&id);
        if mode == Overwrite::Never && locally_known {
            // Already stored (and uploaded or queued) or a conflict: local decides.
            return self.store_local(block, mode, timing).await;
        }
        let fail = |e: Error| {
            obj.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            e
        };
        match obj.opts.policy {
            ObjectWritePolicy::WriteThrough => {
                // Durable in the store first: a failure leaves nothing behind.
                let t0 = Instant::now();
                let r = obj.tier.put(block.clone()).await;
                timing.add(TierKind::Object, t0.elapsed());
                r.map_err(fail)?;
                self.store_local(block, mode, timing).await
            }
            ObjectWritePolicy::WriteBack => {
                let wb = obj.writeback.as_ref().expect("write-back has a queue");
                let out = self.store_local(block.clone(), mode, timing).await?;
                let t0 = Instant::now();
                let r = wb
                    .enqueue(block, crate::deadline::budget(obj.opts.enqueue_timeout))
                    .await;
                timing.add(TierKind::Object, t0.elapsed());
                if let Err(e) = r {
                    // Not acknowledged, so not kept locally either.
                    if out == WriteOutcome::Stored {
                        self.memory.remove(&id);
                        if let Some(d) = &self.disk {
                            let _ = d.delete(&id).await;
                        }
                    }
                    return Err(fail(e));
                }
                Ok(out)
            }
        }
    }

    /// Copies a block read from the object store to the disk tier in the
    /// background (best effort; the read does not wait).
    fn promote_to_disk(&self, b: &Block) {
        let (Some(disk), Some(obj)) = (&self.disk, &self.object) else {
            return;
        };
        if disk.has(&b.meta.id) {
            return;
        }
        let (disk, b, c) = (disk.clone(), b.clone(), obj.counters.clone());
        tokio::spawn(async move {
            match disk.put_with(b, Overwrite::Never).await {
                Ok(_) => {
                    c.promotions_to_disk.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "promotion from the object store to disk failed")
                }
            }
        });
    }

    /// Stores in memory and (per the disk policy) on disk.
    async fn store_local(
        &self,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        self.check_size(block.payload.len())?;
        // Registered before the memory step, so a concurrent eviction of this
        // block does not demote it while this write is putting it on disk.
        let _writing = (self.disk.is_some() && self.policy == WritePolicy::WriteThrough)
            .then(|| WritingGuard::new(&self.writing, &block.meta.id));
        let t0 = Instant::now();
        let r = self.memory.put_block_evicting(block.clone(), mode);
        timing.add(TierKind::Memory, t0.elapsed());
        let Some(disk) = &self.disk else {
            return Ok(r?.0);
        };
        let (mem, evicted) = match r {
            Ok((o, ev)) => (Some(o), ev),
            // No room in memory (chain longer than memory, or pinned): the
            // block can still live on disk.
            Err(e) if e.kind == ErrorKind::ResourceExhausted => (None, Vec::new()),
            Err(e) => return Err(e),
        };
        let result = match (self.policy, mem) {
            (WritePolicy::WriteBack, Some(o)) => Ok(o),
            // Identical block already in memory and on disk: nothing to write.
            (_, Some(PutOutcome::Existing)) if disk.has(&block.meta.id) => Ok(PutOutcome::Existing),
            _ => {
                let id = block.meta.id.clone();
                let t0 = Instant::now();
                let d = disk.put_with(block, mode).await;
                timing.add(TierKind::Disk, t0.elapsed());
                match (d, mem) {
                    (Ok(o), _) => Ok(o),
                    (Err(e), Some(o)) if disk.config().sync != SyncMode::Always => {
                        self.counters
                            .degraded_writes
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(key = ?id.key, namespace = %id.namespace, error = %e,
                            "disk tier refused a write; kept in memory only");
                        Ok(o)
                    }
                    (Err(e), mem) => {
                        // Not acknowledged, so not kept: drop the copy memory just took.
                        if mem == Some(PutOutcome::Stored) {
                            self.memory.remove(&id);
                        }
                        Err(e)
                    }
                }
            }
        };
        self.demote(evicted, timing).await;
        result
    }

    /// Writes blocks evicted from memory to the disk tier unless it holds them
    /// already (under write-through it normally does). Best effort: failures
    /// are counted and logged.
    async fn demote(&self, evicted: Vec<Block>, timing: &mut StorageTiming) {
        let Some(disk) = &self.disk else { return };
        let now = crate::clock::unix_ms();
        for b in evicted {
            // `writing` before `has`: a write-through that is no longer in
            // flight has committed (or failed), so `has` is then current.
            if b.expired_at(now)
                || self.writing.lock().contains_key(&b.meta.id)
                || disk.has(&b.meta.id)
            {
                continue;
            }
            let t0 = Instant::now();
            let r = disk.put_with(b, Overwrite::Never).await;
            timing.add(TierKind::Disk, t0.elapsed());
            match r {
                Ok(_) => self.counters.demotions.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(error = %e, "demotion to the disk tier failed; block dropped");
                    self.counters
                        .demotion_failures
                        .fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }

    /// Whether memory or disk holds `id` (the object store not asked).
    fn held_locally(&self, id: &BlockId) -> bool {
        self.memory.contains_block(id) || self.disk.as_ref().is_some_and(|d| d.has(id))
    }

    /// Fails with `InvalidArgument` naming the limit if `len` is too large.
    pub fn check_size(&self, len: usize) -> Result<()> {
        let max = self.cfg.max_block_size;
        if len as u64 > max.bytes() {
            return Err(Error::invalid(format!(
                "payload of {len} bytes exceeds the maximum block size of {max} ({} bytes)",
                max.bytes()
            )));
        }
        Ok(())
    }

    /// Deletes a block (and its descendants) from every tier; returns how many
    /// blocks were removed from the tier that held the most.
    pub async fn delete(&self, id: &BlockId, timing: &mut StorageTiming) -> Result<u64> {
        let t0 = Instant::now();
        let mut n = self.memory.remove(id);
        timing.add(TierKind::Memory, t0.elapsed());
        for t in self.lower() {
            let t0 = Instant::now();
            let r = t.delete(id).await;
            timing.add(t.kind(), t0.elapsed());
            n = n.max(r?);
        }
        Ok(n)
    }

    /// Removes expired blocks from memory and the disk tier's index (their
    /// files are unlinked in the background); returns how many. Called
    /// periodically; does no blocking I/O.
    pub fn purge_expired(&self) -> u64 {
        self.memory.purge_expired() + self.disk.as_ref().map_or(0, |d| d.purge_expired())
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        let mut tiers = vec![(TierKind::Memory, Tier::stats(&*self.memory))];
        tiers.extend(self.lower().map(|t| (t.kind(), t.stats())));
        EngineStats {
            tiers,
            active_leases: self.leases.active().0,
            pinned_bytes: self.leases.pinned_total(),
            lease_refusals: self.counters.lease_refusals.load(Ordering::Relaxed),
            degraded_writes: self.counters.degraded_writes.load(Ordering::Relaxed),
            demotions: self.counters.demotions.load(Ordering::Relaxed),
            demotion_failures: self.counters.demotion_failures.load(Ordering::Relaxed),
            object: self.object.as_ref().map(ObjectLink::stats),
        }
    }
}

/// Marks a block as being written through to disk for its lifetime.
struct WritingGuard<'a> {
    set: &'a parking_lot::Mutex<std::collections::HashMap<BlockId, usize>>,
    id: BlockId,
}

impl<'a> WritingGuard<'a> {
    fn new(
        set: &'a parking_lot::Mutex<std::collections::HashMap<BlockId, usize>>,
        id: &BlockId,
    ) -> Self {
        *set.lock().entry(id.clone()).or_default() += 1;
        Self {
            set,
            id: id.clone(),
        }
    }
}

impl Drop for WritingGuard<'_> {
    fn drop(&mut self) {
        let mut set = self.set.lock();
        if let Some(n) = set.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                set.remove(&self.id);
            }
        }
    }
}
