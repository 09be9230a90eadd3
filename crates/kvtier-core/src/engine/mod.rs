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
use crate::admission::{Admission, Admitter, Decision};
use crate::block::{Block, BlockId};
use crate::cluster::Peers;
use crate::disk::{DiskTier, SyncMode};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{HashFn, Key, Namespace};
use crate::lease::{LeaseGrant, LeaseTable};
use crate::memory::{MemoryTier, Overwrite};
use crate::object_link::{ObjectLink, ObjectOptions, ObjectWritePolicy};
use crate::tier::{PutOutcome, Tier, TierKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Blocks whose uses an admission policy remembers (per lower tier): for
/// `reuse` up to 2 × 2^18 hashes (at most ~16 MB with their queues), for
/// `tinylfu` a fixed 1.25 MiB sketch (docs/cache-choice.md).
pub const ADMISSION_WINDOW: usize = 1 << 18;

/// Engine reads a prefix read keeps in flight in a cluster without an object
/// tier (peer round trips; notes/022).
pub const PEER_READ_AHEAD: usize = 4;

mod admit;
mod cluster;
mod leases;
mod types;
mod write;

pub use types::{
    EngineConfig, EngineStats, LookupOutcome, Place, StorageTiming, WriteOutcome, WritePolicy,
};

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
    /// Shared with the local twin: one pin budget per node.
    leases: Arc<LeaseTable>,
    /// Shared with demotion tasks (see [`Engine::demote`]).
    counters: Arc<Counters>,
    /// Blocks whose write-through to the disk tier is in progress (with a count
    /// of concurrent writers): memory may evict them before that write lands,
    /// and demoting them then would write the same record twice (and report
    /// the caller's fresh write as `Existing`).
    /// Shared with the local twin, which writes into the same tiers.
    writing: Arc<parking_lot::Mutex<std::collections::HashMap<BlockId, usize>>>,
    /// The object-store tier, if configured.
    object: Option<ObjectLink>,
    /// The other nodes of a cluster, if this node is in one.
    peers: Option<Arc<dyn Peers>>,
    /// Which blocks the disk tier takes (shared with demotion tasks).
    disk_admission: Arc<Admitter>,
    /// Which blocks the object store takes.
    object_admission: Arc<Admitter>,
}

/// Builds an [`Engine`]: memory, then optionally a disk and an object store.
pub struct EngineBuilder {
    cfg: EngineConfig,
    disk: Option<(Arc<DiskTier>, WritePolicy)>,
    object: Option<(Arc<dyn Tier>, ObjectOptions)>,
    peers: Option<Arc<dyn Peers>>,
    admission: (Admission, Admission),
    events: Option<Arc<dyn crate::events::EventSink>>,
}

impl EngineBuilder {
    /// Which blocks the disk tier and the object store take: every block at
    /// its first write ([`Admission::All`], the default), or only blocks used
    /// again (docs/cache-choice.md, "Admission to the lower tiers").
    pub fn admission(mut self, disk: Admission, object: Admission) -> Self {
        self.admission = (disk, object);
        self
    }

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

    /// The other nodes of a cluster: blocks are placed on their owners
    /// (`docs/cluster.md`), asked after the local tiers and before the object
    /// store.
    pub fn peers(mut self, peers: Arc<dyn Peers>) -> Self {
        self.peers = Some(peers);
        self
    }

    /// Reports every residency change of every tier to `sink`, if any (KV
    /// events, `docs/events.md`), starting with what the disk tier holds now.
    pub fn events(mut self, sink: Option<Arc<dyn crate::events::EventSink>>) -> Self {
        self.events = sink;
        self
    }

    /// The engine. Must run inside a Tokio runtime when an object store with
    /// write-back is configured (its uploader starts here).
    pub fn build(self) -> Engine {
        let memory = Arc::new(MemoryTier::with_shares(
            self.cfg.memory_capacity.bytes(),
            Arc::new(self.cfg.shares.clone()),
        ));
        let leases = Arc::new(LeaseTable::new(self.cfg.pin_budget()));
        let (disk, policy) = match self.disk {
            Some((d, p)) => (Some(d), p),
            None => (None, WritePolicy::default()),
        };
        let mut object = self.object;
        if let Some(sink) = &self.events {
            memory.observe(crate::events::observer(
                sink.clone(),
                crate::events::Medium::Memory,
            ));
            if let Some(d) = &disk {
                d.observe(sink.clone());
            }
            object = object.map(|(inner, o)| {
                let t: Arc<dyn Tier> = Arc::new(crate::events::ObservedTier {
                    inner,
                    sink: sink.clone(),
                });
                (t, o)
            });
        }
        Engine {
            cfg: self.cfg,
            memory,
            disk,
            policy,
            leases,
            counters: Arc::default(),
            writing: Default::default(),
            object: object.map(|(t, o)| ObjectLink::new(t, o)),
            peers: self.peers,
            disk_admission: Arc::new(Admitter::new(self.admission.0, ADMISSION_WINDOW)),
            object_admission: Arc::new(Admitter::new(self.admission.1, ADMISSION_WINDOW)),
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
            peers: None,
            admission: Default::default(),
            events: None,
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

    /// Engine reads a prefix read should keep in flight: the object tier's
    /// `read_ahead`, [`PEER_READ_AHEAD`] in a cluster without one, and 1 for
    /// local tiers only (their reads do not wait).
    pub fn read_ahead(&self) -> usize {
        match (&self.object, &self.peers) {
            (Some(o), _) => o.opts.read_ahead.max(1),
            (None, Some(_)) => PEER_READ_AHEAD,
            (None, None) => 1,
        }
    }

    /// Starts reading into memory, in the background, the leading blocks a
    /// lookup found only in the object store (`tiers[i]` is key `i`'s tier),
    /// so that the read the client sends next finds them there or joins
    /// their fetch ([`ObjectLink::get`]). Bounded three ways: at most
    /// `read_ahead` GETs per lookup and four times that for all lookups
    /// together, and no more than half the memory tier per lookup (later
    /// blocks would evict the earlier ones before they are read). Off when
    /// `ObjectOptions::prefetch` is false.
    pub fn prefetch(self: &Arc<Self>, ns: &Namespace, keys: &[Key], tiers: &[TierKind]) {
        let Some(obj) = &self.object else { return };
        if !obj.opts.prefetch {
            return;
        }
        let ids: Vec<BlockId> = keys
            .iter()
            .zip(tiers)
            .filter(|(_, t)| **t == TierKind::Object)
            .map(|(k, _)| BlockId::new(ns.clone(), k.clone()))
            .collect();
        if ids.is_empty() {
            return;
        }
        let (engine, depth) = (self.clone(), obj.opts.read_ahead.max(1));
        let slots = obj.prefetch_slots.clone();
        let budget = self.cfg.memory_capacity.bytes() / 2;
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut reads = futures::stream::iter(ids)
                .map(|id| {
                    let (engine, slots) = (engine.clone(), slots.clone());
                    async move {
                        let _slot = slots.acquire_owned().await.ok()?;
                        let mut t = StorageTiming::default();
                        engine.read(&id, &mut t).await.ok().flatten()
                    }
                })
                .buffered(depth);
            let mut bytes = 0u64;
            while let Some(got) = reads.next().await {
                let Some((b, _)) = got else { break };
                if let Some(o) = &engine.object {
                    o.counters.prefetched.fetch_add(1, Ordering::Relaxed);
                }
                bytes += b.payload.len() as u64;
                if bytes >= budget {
                    break;
                }
            }
        });
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
        let (mut tiers, mut ids) = match &self.peers {
            Some(peers) => self.lookup_in_cluster(&**peers, ns, keys, timing).await,
            None => {
                let (t, ids) = self.lookup_local(ns, keys, timing).await?;
                (t.into_iter().map(Place::here).collect(), ids)
            }
        };
        if let Some(obj) = &self.object
            && ids.len() < keys.len()
        {
            let t0 = Instant::now();
            let n = obj
                .lookup(ns, &keys[ids.len()..], |id: &BlockId| self.held_locally(id))
                .await;
            timing.add(TierKind::Object, t0.elapsed());
            for key in &keys[ids.len()..ids.len() + n] {
                tiers.push(Place::here(TierKind::Object));
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
        let places = tiers
            .iter()
            .map(|p| {
                let node = p.peer.zip(self.peers.as_ref()).map(|(id, ps)| ps.name(id));
                (p.tier, node)
            })
            .collect();
        Ok(LookupOutcome {
            found: tiers.len(),
            tiers: tiers.iter().map(Place::reported).collect(),
            places,
            lease,
        })
    }

    /// The leading `keys` memory or disk holds, with the tier of each.
    async fn lookup_local(
        &self,
        ns: &Namespace,
        keys: &[Key],
        timing: &mut StorageTiming,
    ) -> Result<(Vec<TierKind>, Vec<BlockId>)> {
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
        Ok((tiers, ids))
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
            self.used_again(&b);
            return Ok(Some((b, TierKind::Memory)));
        }
        for t in self.below_memory() {
            let t0 = Instant::now();
            let got = t.get(id).await;
            timing.add(t.kind(), t0.elapsed());
            if let Some(b) = got? {
                self.used_again(&b);
                self.promote(&b, timing).await;
                return Ok(Some((b, t.kind())));
            }
        }
        let mut owners = None;
        if let Some(peers) = &self.peers {
            let (got, o) = self.read_from_peers(&**peers, id, timing).await;
            if let Some(b) = got {
                // Only an owner keeps a copy: hot blocks are not duplicated on
                // every node a request happens to land on.
                if o.local {
                    self.promote(&b, timing).await;
                }
                return Ok(Some((b, TierKind::Peer)));
            }
            owners = Some(o);
        }
        if let Some(obj) = &self.object {
            let t0 = Instant::now();
            let got = obj.get(id).await;
            timing.add(TierKind::Object, t0.elapsed());
            if let Some(b) = got? {
                match &owners {
                    Some(o) if !o.local => self.replicate_to_owners(o, &b),
                    // A prefetch and a read that shared one fetch promote once.
                    _ if self.memory.contains_block(id) => {}
                    _ => {
                        self.promote(&b, timing).await;
                        self.promote_to_disk(&b);
                    }
                }
                return Ok(Some((b, TierKind::Object)));
            }
        }
        Ok(None)
    }

    /// Copies a block read from below into memory, demoting what that
    /// evicts. Best effort: a full memory tier must not fail the read.
    async fn promote(&self, b: &Block, timing: &mut StorageTiming) {
        let t0 = Instant::now();
        let evicted = self.memory.put_block_evicting(b.clone(), Overwrite::Never);
        timing.add(TierKind::Memory, t0.elapsed());
        if let Ok((_, evicted)) = evicted {
            self.demote(evicted, timing).await;
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
        if let Some(peers) = &self.peers {
            n = n.max(self.delete_on_peers(&**peers, id, timing).await);
        }
        Ok(n)
    }

    /// Removes expired blocks from memory and the disk tier's index (their
    /// files are unlinked in the background); returns how many. Called
    /// periodically; does no blocking I/O.
    pub fn purge_expired(&self) -> u64 {
        self.memory.purge_expired() + self.disk.as_ref().map_or(0, |d| d.purge_expired())
    }

    /// Resident bytes and evictions per capacity-share label, per local tier.
    pub fn share_stats(&self) -> Vec<(TierKind, Vec<crate::shares::ShareStat>)> {
        let mut v = vec![(TierKind::Memory, self.memory.share_stats())];
        v.extend(self.disk.iter().map(|d| (TierKind::Disk, d.share_stats())));
        v
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
