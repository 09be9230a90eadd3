//! How the engine uses an object-store tier: write policy, the write-back
//! upload queue and the parallel lookup of keys no local tier knows.
//!
//! The tier itself (a [`Tier`] with [`TierKind::Object`](crate::tier::TierKind::Object), e.g. `kvtier-object`'s
//! `ObjectTier`) only stores and fetches objects; everything about *when* the
//! engine talks to it lives here. See `docs/object-store.md`.
use crate::block::{Block, BlockId};
use crate::error::{Error, Result};
use crate::keys::{Key, Namespace};
use crate::tier::Tier;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

/// When a write is acknowledged with an object-store tier configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ObjectWritePolicy {
    /// Acknowledged once the object store has the block (and the local tiers
    /// per the disk policy). A store outage fails writes.
    WriteThrough,
    /// Acknowledged once the local tiers have it; a bounded background queue
    /// uploads it, retrying until the store takes it (the default: a store
    /// outage or a slow store never slows or fails writes until the queue is
    /// full).
    #[default]
    WriteBack,
}

impl ObjectWritePolicy {
    /// The config / CLI name.
    pub fn name(self) -> &'static str {
        match self {
            ObjectWritePolicy::WriteThrough => "write-through",
            ObjectWritePolicy::WriteBack => "write-back",
        }
    }
}

impl FromStr for ObjectWritePolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "write-through" => Ok(ObjectWritePolicy::WriteThrough),
            "write-back" => Ok(ObjectWritePolicy::WriteBack),
            _ => Err(Error::invalid(format!(
                "unknown object write policy {s:?}; expected write-through or write-back"
            ))),
        }
    }
}

impl std::fmt::Display for ObjectWritePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Engine-side settings of the object-store tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectOptions {
    /// Write policy.
    pub policy: ObjectWritePolicy,
    /// Blocks waiting for upload at most (write-back); a write that finds the
    /// queue full waits for a slot until its deadline, then fails `UNAVAILABLE`.
    pub queue_capacity: usize,
    /// Uploads in flight at once (write-back).
    pub upload_concurrency: usize,
    /// Existence checks (HEAD) in flight at once for one lookup.
    pub lookup_concurrency: usize,
    /// Longest a lookup waits for the store (also capped by the request deadline).
    pub lookup_timeout: Duration,
    /// Longest a write waits for a queue slot when no request deadline is set.
    pub enqueue_timeout: Duration,
    /// Human-readable name of the store (its URL), for messages.
    pub store_name: String,
    /// Engine reads one prefix read keeps in flight when its blocks may come
    /// from the store (notes/023: a cold 256-block read behind 20 ms).
    pub read_ahead: usize,
    /// Whether a lookup that finds blocks only in the store starts reading
    /// them into memory at once, before the client's read asks for them.
    pub prefetch: bool,
}

impl Default for ObjectOptions {
    fn default() -> Self {
        Self {
            policy: ObjectWritePolicy::default(),
            queue_capacity: 1024,
            upload_concurrency: 8,
            lookup_concurrency: 32,
            lookup_timeout: Duration::from_secs(2),
            enqueue_timeout: Duration::from_secs(5),
            store_name: "object store".into(),
            read_ahead: 16,
            prefetch: true,
        }
    }
}

/// Object-store counters of the engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObjectStats {
    /// Write policy in force.
    pub policy: ObjectWritePolicy,
    /// Blocks waiting for (or in) upload.
    pub queue_depth: u64,
    /// Queue capacity.
    pub queue_capacity: u64,
    /// Age of the oldest block waiting for upload (0 when none).
    pub upload_lag: Duration,
    /// Blocks uploaded by the write-back queue.
    pub uploads: u64,
    /// Upload attempts that failed and were retried.
    pub upload_retries: u64,
    /// Queued uploads skipped because a newer value of the key was queued.
    pub uploads_superseded: u64,
    /// Writes refused because the store failed (write-through) or the queue
    /// stayed full (write-back).
    pub write_failures: u64,
    /// Lookups that could not ask the store (error or deadline) and answered
    /// from local knowledge only.
    pub lookup_degraded: u64,
    /// Existence checks sent to the tier (before its cache).
    pub lookup_checks: u64,
    /// Blocks read from the store and copied to the disk tier.
    pub promotions_to_disk: u64,
    /// Block reads from the store (GETs started).
    pub fetches: u64,
    /// Reads that found the same block's fetch already under way and waited
    /// for it instead of starting another.
    pub fetches_joined: u64,
    /// Blocks read into memory by lookups' prefetches.
    pub prefetched: u64,
    /// The tier's own counters ([`Tier::extra_counters`]).
    pub tier_counters: Vec<(&'static str, &'static str, u64)>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub write_failures: AtomicU64,
    pub lookup_degraded: AtomicU64,
    pub lookup_checks: AtomicU64,
    pub promotions_to_disk: AtomicU64,
    pub fetches: AtomicU64,
    pub fetches_joined: AtomicU64,
    pub prefetched: AtomicU64,
}

/// A block read from the store that any number of readers may wait for.
type Fetch = Shared<BoxFuture<'static, Result<Option<Block>>>>;

/// The engine's handle on its object-store tier.
pub(crate) struct ObjectLink {
    pub tier: Arc<dyn Tier>,
    pub opts: ObjectOptions,
    pub writeback: Option<WriteBack>,
    pub counters: Arc<Counters>,
    /// Reads from the store under way, by block: one GET per block at a time.
    fetches: Arc<Mutex<HashMap<BlockId, Fetch>>>,
    /// Bounds the GETs prefetches keep in flight, all lookups together.
    pub prefetch_slots: Arc<Semaphore>,
    /// Write-back writes under way (stored locally, upload being queued), by
    /// block: see [`ObjectLink::enqueuing`].
    enqueuing: Mutex<HashMap<BlockId, Enqueuing>>,
}

/// The write-back writes of one block under way together.
#[derive(Default)]
struct Enqueuing {
    writers: usize,
    /// One of them stored the local copy (the others found it).
    stored: bool,
    /// One of them queued the upload and was acknowledged.
    acked: bool,
}

/// One write-back write of a block, from before its local store until it
/// returns. While any is under way, a writer of the same block queues its
/// own upload instead of taking "already stored" from a local copy whose
/// upload may still fail (and be removed); the copy is removed only if
/// every writer failed.
pub(crate) struct EnqueueGuard<'a> {
    map: &'a Mutex<HashMap<BlockId, Enqueuing>>,
    id: BlockId,
}

impl EnqueueGuard<'_> {
    /// This writer stored the local copy.
    pub fn stored(&self) {
        self.with(|e| e.stored = true);
    }

    /// This writer's upload is queued: the block is acknowledged.
    pub fn acked(&self) {
        self.with(|e| e.acked = true);
    }

    /// Whether this writer, failing, must remove the local copy: it is the
    /// last one under way, none was acknowledged, and one stored the copy.
    /// The entry stays (this guard counts) until the removal is done, so a
    /// writer arriving meanwhile queues its own upload.
    pub fn remove_on_failure(&self) -> bool {
        self.with(|e| e.writers == 1 && !e.acked && e.stored)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Enqueuing) -> T) -> T {
        f(self.map.lock().get_mut(&self.id).expect("registered"))
    }
}

impl Drop for EnqueueGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.map.lock();
        if let Some(e) = m.get_mut(&self.id) {
            e.writers -= 1;
            if e.writers == 0 {
                m.remove(&self.id);
            }
        }
    }
}

impl ObjectLink {
    pub fn new(tier: Arc<dyn Tier>, opts: ObjectOptions) -> Self {
        let writeback = (opts.policy == ObjectWritePolicy::WriteBack)
            .then(|| WriteBack::start(tier.clone(), &opts));
        let prefetch_slots = Arc::new(Semaphore::new(opts.read_ahead.max(1) * 4));
        Self {
            tier,
            opts,
            writeback,
            counters: Arc::default(),
            fetches: Arc::default(),
            prefetch_slots,
            enqueuing: Mutex::default(),
        }
    }

    /// Registers a write-back write of `id` (see [`EnqueueGuard`]).
    pub fn enqueuing(&self, id: &BlockId) -> EnqueueGuard<'_> {
        self.enqueuing.lock().entry(id.clone()).or_default().writers += 1;
        EnqueueGuard {
            map: &self.enqueuing,
            id: id.clone(),
        }
    }

    /// Whether a write-back write of `id` is under way.
    pub fn is_enqueuing(&self, id: &BlockId) -> bool {
        self.enqueuing.lock().contains_key(id)
    }

    /// Reads `id` from the store, or waits for the read of it already under
    /// way (a prefetch, or another request). The GET runs in its own task, so
    /// a reader that gives up (deadline, dropped request) does not cancel it
    /// for the others, and its entry is removed when it ends: a later read
    /// asks the store again. The task keeps the deadline of the request that
    /// started it, so the store call fails `UNAVAILABLE` within that
    /// request's budget as before; a reader that joins it is bounded by its
    /// own deadline where it waits (the prefix reader's). A read that misses
    /// memory in the moment between a fetch's end and its reader's promotion
    /// starts a second GET of the block: rare, and costs only the transfer.
    pub async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        self.fetch(id).await
    }

    fn fetch(&self, id: &BlockId) -> Fetch {
        let mut m = self.fetches.lock();
        match m.get(id) {
            Some(f) => {
                self.counters.fetches_joined.fetch_add(1, Ordering::Relaxed);
                f.clone()
            }
            None => {
                self.counters.fetches.fetch_add(1, Ordering::Relaxed);
                let (tier, fetches, key) = (self.tier.clone(), self.fetches.clone(), id.clone());
                // The entry is inserted below while the lock is held, so
                // the task's removal cannot come first.
                let deadline = crate::deadline::current();
                let task = tokio::spawn(crate::deadline::scope(deadline, async move {
                    let r = tier.get(&key).await;
                    fetches.lock().remove(&key);
                    r
                }));
                let f: Fetch = async move {
                    task.await.unwrap_or_else(|e| {
                        Err(Error::internal(format!(
                            "object-store read task failed: {e}"
                        )))
                    })
                }
                .boxed()
                .shared();
                m.insert(id.clone(), f.clone());
                f
            }
        }
    }

    pub fn stats(&self) -> ObjectStats {
        let c = &self.counters;
        let mut s = ObjectStats {
            policy: self.opts.policy,
            queue_capacity: self.opts.queue_capacity as u64,
            write_failures: c.write_failures.load(Ordering::Relaxed),
            lookup_degraded: c.lookup_degraded.load(Ordering::Relaxed),
            lookup_checks: c.lookup_checks.load(Ordering::Relaxed),
            promotions_to_disk: c.promotions_to_disk.load(Ordering::Relaxed),
            fetches: c.fetches.load(Ordering::Relaxed),
            fetches_joined: c.fetches_joined.load(Ordering::Relaxed),
            prefetched: c.prefetched.load(Ordering::Relaxed),
            tier_counters: self.tier.extra_counters(),
            ..Default::default()
        };
        if let Some(wb) = &self.writeback {
            let st = &wb.state;
            s.queue_depth = st.pending.lock().len() as u64;
            s.upload_lag = st.lag();
            s.uploads = st.uploaded.load(Ordering::Relaxed);
            s.upload_retries = st.retries.load(Ordering::Relaxed);
            s.uploads_superseded = st.superseded.load(Ordering::Relaxed);
        }
        s
    }

    /// Asks the store, in parallel waves of `lookup_concurrency`, which of
    /// `keys` it holds; returns how many leading keys it has. `known` answers
    /// from local tiers first (no request for those). Errors and the deadline
    /// end the walk: the answer is then what is known so far.
    pub async fn lookup(
        &self,
        ns: &Namespace,
        keys: &[Key],
        known: impl Fn(&BlockId) -> bool,
    ) -> usize {
        let budget = crate::deadline::budget(self.opts.lookup_timeout);
        let until = tokio::time::Instant::now() + budget;
        let wave = self.opts.lookup_concurrency.max(1);
        let mut found = 0;
        for chunk in keys.chunks(wave) {
            let mut set = tokio::task::JoinSet::new();
            let mut answers = vec![false; chunk.len()];
            for (i, key) in chunk.iter().enumerate() {
                let id = BlockId::new(ns.clone(), key.clone());
                if known(&id) {
                    answers[i] = true;
                    continue;
                }
                self.counters.lookup_checks.fetch_add(1, Ordering::Relaxed);
                let tier = self.tier.clone();
                set.spawn(async move { (i, tier.contains(&id).await) });
            }
            let collect = async {
                while let Some(r) = set.join_next().await {
                    match r {
                        Ok((i, Ok(hit))) => answers[i] = hit,
                        Ok((_, Err(e))) => return Err(e),
                        Err(e) => return Err(Error::internal(format!("lookup task failed: {e}"))),
                    }
                }
                Ok(())
            };
            let outcome = match tokio::time::timeout_at(until, collect).await {
                Ok(r) => r,
                Err(_) => Err(Error::unavailable(format!(
                    "{} did not answer a lookup within {} ms",
                    self.opts.store_name,
                    budget.as_millis()
                ))),
            };
            if let Err(e) = outcome {
                self.counters
                    .lookup_degraded
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "lookup answered from local tiers only");
                // Keys answered before the failure still count when leading.
                return found + answers.iter().take_while(|a| **a).count();
            }
            let lead = answers.iter().take_while(|a| **a).count();
            found += lead;
            if lead < chunk.len() {
                break;
            }
        }
        found
    }
}

const STRIPES: usize = 64;

/// The write-back upload queue.
#[derive(Clone)]
pub(crate) struct WriteBack {
    tx: mpsc::UnboundedSender<Item>,
    state: Arc<State>,
}

struct Item {
    seq: u64,
    block: Block,
    _slot: OwnedSemaphorePermit,
}

struct State {
    tier: Arc<dyn Tier>,
    store_name: String,
    capacity: usize,
    slots: Arc<Semaphore>,
    uploaders: Arc<Semaphore>,
    /// seq → enqueue time of every block not yet uploaded.
    pending: Mutex<BTreeMap<u64, Instant>>,
    /// Latest queued seq per id (an older one is skipped).
    latest: Mutex<HashMap<BlockId, u64>>,
    /// Uploads of one id run one at a time, oldest first.
    stripes: Vec<tokio::sync::Mutex<()>>,
    next_seq: AtomicU64,
    uploaded: AtomicU64,
    retries: AtomicU64,
    superseded: AtomicU64,
    idle: Notify,
}

impl State {
    fn lag(&self) -> Duration {
        self.pending
            .lock()
            .values()
            .next()
            .map_or(Duration::ZERO, |t| t.elapsed())
    }
}

impl WriteBack {
    /// Starts the uploader; must run inside a Tokio runtime.
    fn start(tier: Arc<dyn Tier>, opts: &ObjectOptions) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Item>();
        let state = Arc::new(State {
            tier,
            store_name: opts.store_name.clone(),
            capacity: opts.queue_capacity.max(1),
            slots: Arc::new(Semaphore::new(opts.queue_capacity.max(1))),
            uploaders: Arc::new(Semaphore::new(opts.upload_concurrency.max(1))),
            pending: Mutex::default(),
            latest: Mutex::default(),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            next_seq: AtomicU64::new(1),
            uploaded: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            superseded: AtomicU64::new(0),
            idle: Notify::new(),
        });
        let st = state.clone();
        tokio::spawn(async move {
            while let Some(item) = rx.recv().await {
                let permit = st
                    .uploaders
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("never closed");
                let st = st.clone();
                tokio::spawn(async move {
                    upload(&st, item).await;
                    drop(permit);
                });
            }
        });
        Self { tx, state }
    }

    /// Queues `block` for upload, waiting up to `wait` for a free slot.
    pub async fn enqueue(&self, block: Block, wait: Duration) -> Result<()> {
        let st = &self.state;
        let slot = match tokio::time::timeout(wait, st.slots.clone().acquire_owned()).await {
            Ok(p) => p.expect("never closed"),
            Err(_) => {
                return Err(Error::unavailable(format!(
                    "write-back queue full: {} blocks waiting for upload to {} (slow or unreachable); write not accepted",
                    st.capacity, st.store_name
                )));
            }
        };
        let seq = st.next_seq.fetch_add(1, Ordering::Relaxed);
        st.pending.lock().insert(seq, Instant::now());
        st.latest.lock().insert(block.meta.id.clone(), seq);
        self.tx
            .send(Item {
                seq,
                block,
                _slot: slot,
            })
            .map_err(|_| Error::internal("write-back uploader stopped"))
    }

    /// Waits until every queued block is uploaded; false on timeout.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let st = &self.state;
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let idle = st.idle.notified();
            if st.pending.lock().is_empty() {
                return true;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return st.pending.lock().is_empty();
            }
        }
    }
}

fn stripe_of(id: &BlockId) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    (h.finish() as usize) % STRIPES
}

async fn upload(st: &State, item: Item) {
    let id = item.block.meta.id.clone();
    let _one_at_a_time = st.stripes[stripe_of(&id)].lock().await;
    let mut backoff = Duration::from_millis(50);
    let mut attempt = 0u32;
    loop {
        if st.latest.lock().get(&id).is_some_and(|&s| s > item.seq) {
            st.superseded.fetch_add(1, Ordering::Relaxed);
            break;
        }
        attempt += 1;
        match st.tier.put(item.block.clone()).await {
            Ok(_) => {
                st.uploaded.fetch_add(1, Ordering::Relaxed);
                break;
            }
            Err(e) => {
                st.retries.fetch_add(1, Ordering::Relaxed);
                if attempt == 1 || attempt.is_multiple_of(20) {
                    tracing::warn!(key = ?id.key, namespace = %id.namespace, attempt, error = %e,
                        "write-back upload failed; kept and retrying");
                }
                // Exponential backoff with jitter, capped at 5 s.
                let jitter = (item.seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ attempt as u64) % 1000;
                let sleep = backoff.mul_f64(0.5 + jitter as f64 / 2000.0);
                tokio::time::sleep(sleep).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    {
        let mut latest = st.latest.lock();
        if latest.get(&id) == Some(&item.seq) {
            latest.remove(&id);
        }
    }
    let empty = {
        let mut p = st.pending.lock();
        p.remove(&item.seq);
        p.is_empty()
    };
    if empty {
        st.idle.notify_waiters();
    }
}
