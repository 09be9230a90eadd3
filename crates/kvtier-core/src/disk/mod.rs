//! The local disk tier: blocks survive restarts, are verified on every read
//! and are evicted leaf-first so chains stay prefix-closed on disk too.
//!
//! ## Layout: one file per block
//! ```text
//!   <dir>/FORMAT                     "kvtier-disk-format 2"
//!   <dir>/LOCK                       flock'd by the owning process
//!   <dir>/blocks/<hh>/<hash>-<seq>.kvb   committed record (header + payload)
//!   <dir>/blocks/<hh>/<hash>-<seq>.tmp   record being written (deleted on open)
//! ```
//! `hash` is 32 hex digits of SHA-256(namespace, key) (its first byte names
//! the shard `hh`), `seq` a per-write sequence number. The record format is in
//! [`format`] and `docs/disk-format.md`.
//!
//! A write goes to a temp file, is (per [`SyncMode`]) `fdatasync`ed, renamed to
//! its final name and the shard directory `fsync`ed; only then is it entered
//! in the in-memory [`index`] and acknowledged. A crash therefore leaves either
//! a temp file (discarded) or a complete record; a torn record is only possible
//! when the kernel loses dirty pages (power loss) under `Batch` / `Never`, and
//! the per-record checksums catch it. Every file name carries a fresh `seq`,
//! so an eviction unlinking an old file can never race with a re-write of the
//! same id. Why file-per-block rather than segments, and not foyer: see
//! `docs/cache-choice.md`; durability per mode: `docs/durability.md`.
//!
//! Index operations are in memory under one mutex; file I/O runs on
//! `spawn_blocking` (the async [`Tier`] methods) or on the tier's background
//! thread ([`background`]), never on the async runtime.
mod background;
pub mod format;
mod index;
mod recovery;
mod store;

use crate::block::{Block, BlockId};
use crate::clock::unix_ms;
use crate::error::{Error, Result};
use crate::size::ByteSize;
use crate::tier::Overwrite;
use crate::tier::{PutOutcome, Tier, TierKind, TierStats};
use async_trait::async_trait;
use background::Background;
use index::{Index, Lookup};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use store::Shared;
use tokio::time::Instant;

pub use recovery::RecoveryReport;

/// Disk space is charged in units of this many bytes (a filesystem block).
pub const ALLOC_UNIT: u64 = 4096;

/// When writes are made durable. See `docs/durability.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// `fdatasync` the record and `fsync` its directory before acknowledging:
    /// an acknowledged write survives power loss.
    /// The default, as the server's (`disk.sync = "always"`): nothing
    /// acknowledged is lost unless asked for.
    #[default]
    Always,
    /// Acknowledge after the rename; a background thread syncs every
    /// [`DiskConfig::batch_interval`]. Power loss can lose writes acknowledged
    /// in the last interval (plus the flush time); a process crash loses nothing.
    Batch,
    /// Never sync: the page cache decides. Power loss can lose any recent
    /// write; a process crash loses nothing.
    Never,
}

impl SyncMode {
    /// The config / CLI name.
    pub fn name(self) -> &'static str {
        match self {
            SyncMode::Always => "always",
            SyncMode::Batch => "batch",
            SyncMode::Never => "never",
        }
    }
}

impl FromStr for SyncMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "always" => Ok(SyncMode::Always),
            "batch" => Ok(SyncMode::Batch),
            "never" => Ok(SyncMode::Never),
            _ => Err(Error::invalid(format!(
                "unknown disk sync mode {s:?}; expected always, batch or never"
            ))),
        }
    }
}

impl std::fmt::Display for SyncMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Disk-tier settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// Directory owned by the tier (created if missing).
    pub dir: PathBuf,
    /// Byte budget for record files (each charged its size rounded up to 4 KiB).
    pub capacity: ByteSize,
    /// Durability of acknowledged writes.
    pub sync: SyncMode,
    /// Flush period under [`SyncMode::Batch`].
    pub batch_interval: Duration,
    /// Read and checksum every payload while rebuilding the index on open
    /// (slower start, but corrupt records are dropped and counted up front).
    /// When false only headers and file lengths are checked at open; reads
    /// still verify every payload.
    pub verify_on_open: bool,
    /// How the tier's capacity is divided between tenants (docs/security.md).
    pub shares: crate::shares::Shares,
    /// Keep the token ids read from the records at open until
    /// [`DiskTier::observe`] announces them (KV events on; docs/events.md).
    /// Off, they are not held in memory.
    pub keep_tokens: bool,
}

impl DiskConfig {
    /// Default batch flush period.
    pub const DEFAULT_BATCH_INTERVAL: Duration = Duration::from_millis(10);

    /// A config with the defaults: `Batch` sync every 10 ms, verify on open.
    pub fn new(dir: impl Into<PathBuf>, capacity: ByteSize) -> Self {
        Self {
            dir: dir.into(),
            capacity,
            sync: SyncMode::default(),
            batch_interval: Self::DEFAULT_BATCH_INTERVAL,
            verify_on_open: true,
            shares: Default::default(),
            keep_tokens: false,
        }
    }
}

/// Disk-specific counters, beyond [`TierStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// The common counters.
    pub tier: TierStats,
    /// Records found corrupt (or unreadable) on read and removed.
    pub corrupt_on_read: u64,
    /// Writes refused for lack of space (capacity with nothing evictable, or ENOSPC).
    pub write_exhausted: u64,
    /// Writes that failed with another I/O error.
    pub write_errors: u64,
    /// Bytes reserved by writes in flight.
    pub reserved_bytes: u64,
    /// Removed records whose files are still queued for unlinking.
    pub pending_unlinks: u64,
}

/// The disk tier. See the module docs.
pub struct DiskTier {
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

impl DiskTier {
    /// Opens (creating if needed) the tier in `cfg.dir` and rebuilds its index
    /// by scanning the records there. Blocking; see [`DiskTier::open_async`].
    ///
    /// Fails with a message naming the path when the directory cannot be
    /// created or written, holds a different format version, or is locked by
    /// another process.
    pub fn open(cfg: DiskConfig) -> Result<(DiskTier, RecoveryReport)> {
        let (lock, blocks_dir) = recovery::prepare_dir(&cfg.dir)?;
        let mut idx = Index::new(Arc::new(cfg.shares.clone()));
        let (report, max_seq, tokens) = recovery::rebuild(&cfg, &blocks_dir, &mut idx)?;
        let bg = Arc::new(Background::default());
        let shared = Arc::new(Shared {
            cfg,
            blocks_dir,
            index: Mutex::new(idx),
            next_seq: AtomicU64::new(max_seq + 1),
            bg: bg.clone(),
            report: report.clone(),
            recovered_tokens: Mutex::new(tokens),
            corrupt_on_read: AtomicU64::new(0),
            write_exhausted: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            _lock: lock,
        });
        let interval = (shared.cfg.sync == SyncMode::Batch).then_some(shared.cfg.batch_interval);
        let worker = std::thread::Builder::new()
            .name("kvtier-disk-bg".into())
            .spawn(move || bg.run(interval))
            .map_err(|e| {
                Error::internal(format!(
                    "cannot start the disk tier's background thread: {e}"
                ))
            })?;
        Ok((
            DiskTier {
                shared,
                worker: Some(worker),
            },
            report,
        ))
    }

    /// [`DiskTier::open`] on a blocking thread.
    pub async fn open_async(cfg: DiskConfig) -> Result<(DiskTier, RecoveryReport)> {
        tokio::task::spawn_blocking(move || Self::open(cfg))
            .await
            .map_err(|e| Error::internal(format!("disk tier open task failed: {e}")))?
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &DiskConfig {
        &self.shared.cfg
    }

    /// What the index rebuild at open found.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.shared.report
    }

    /// Stores a block with the given overwrite semantics (see [`Overwrite`]).
    pub async fn put_with(&self, block: Block, mode: Overwrite) -> Result<PutOutcome> {
        let s = self.shared.clone();
        blocking(move || s.put(block, mode)).await
    }

    /// Reports every later residency change to `sink` as the disk, after
    /// reporting every block resident now (a warm restart's records, with
    /// the token ids they keep when `keep_tokens` is set).
    pub fn observe(&self, sink: std::sync::Arc<dyn crate::events::EventSink>) {
        let o = crate::events::observer(sink.clone(), crate::events::Medium::Disk);
        let mut tokens = std::mem::take(&mut *self.shared.recovered_tokens.lock());
        let resident = self.shared.index.lock().observe(o);
        for (id, parent) in resident {
            if let Some(t) = tokens.remove(&id) {
                sink.tokens(&id, t);
            }
            sink.change(crate::events::Medium::Disk, true, &id, parent.as_ref());
        }
    }

    /// True when a live record is present, without touching recency or counters.
    pub fn has(&self, id: &BlockId) -> bool {
        self.shared
            .index
            .lock()
            .get(id)
            .is_some_and(|e| e.expires_unix_ms.is_none_or(|x| x > unix_ms()))
    }

    /// What pinning `ids` in order holds on disk, per id (see
    /// [`crate::lease::chain_costs`]).
    pub fn pin_costs(&self, ids: &[BlockId]) -> Vec<u64> {
        let index = self.shared.index.lock();
        index.pin_costs(ids)
    }

    /// Lifts the pins that end exactly at `until` (see `MemoryTier::unpin`).
    pub fn unpin(&self, ids: &[BlockId], until: Instant) {
        self.shared.index.lock().unpin(ids, until);
    }

    /// Pins present records until `until` (leases); returns how many were present.
    pub fn pin(&self, ids: &[BlockId], until: Instant) -> usize {
        self.shared.index.lock().pin(ids, until)
    }

    /// Removes expired records from the index now and queues their files for
    /// unlinking on the background thread; returns how many. Does no I/O.
    pub fn purge_expired(&self) -> u64 {
        let removed = self.shared.index.lock().purge_expired(unix_ms());
        self.shared.unlink_later(&removed);
        removed.len() as u64
    }

    /// The common counters plus the disk-specific ones.
    pub fn disk_stats(&self) -> DiskStats {
        let s = &self.shared;
        let (tier, reserved_bytes) = {
            let idx = s.index.lock();
            (tier_stats(&idx, s.cfg.capacity.bytes()), idx.reserved)
        };
        DiskStats {
            tier,
            corrupt_on_read: s.corrupt_on_read.load(Ordering::Relaxed),
            write_exhausted: s.write_exhausted.load(Ordering::Relaxed),
            write_errors: s.write_errors.load(Ordering::Relaxed),
            reserved_bytes,
            pending_unlinks: s.bg.pending_unlinks() as u64,
        }
    }

    /// Resident bytes and evictions per capacity-share label.
    pub fn share_stats(&self) -> Vec<crate::shares::ShareStat> {
        self.shared.index.lock().share_stats()
    }

    /// Checks the index's structural invariants (for tests).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.shared.index.lock().check_invariants()
    }
}

fn tier_stats(idx: &Index, capacity: u64) -> TierStats {
    TierStats {
        blocks: idx.len() as u64,
        bytes: idx.bytes(),
        capacity_bytes: capacity,
        hits: idx.counters().hits,
        misses: idx.counters().misses,
        evictions: idx.counters().evictions,
        expirations: idx.counters().expirations,
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("disk tier I/O task failed: {e}")))?
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.shared.bg.shutdown();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[async_trait]
impl Tier for DiskTier {
    fn kind(&self) -> TierKind {
        TierKind::Disk
    }
    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        let s = self.shared.clone();
        let id = id.clone();
        blocking(move || s.get(&id)).await
    }
    async fn contains(&self, id: &BlockId) -> Result<bool> {
        // Index only: no I/O, so no blocking thread needed.
        let removed = {
            let mut idx = self.shared.index.lock();
            match idx.lookup(id, unix_ms(), true) {
                Lookup::Live(_) => return Ok(true),
                Lookup::Missing => return Ok(false),
                Lookup::Expired(r) => r,
            }
        };
        self.shared.unlink_later(&removed);
        Ok(false)
    }
    async fn put(&self, block: Block) -> Result<PutOutcome> {
        self.put_with(block, Overwrite::Never).await
    }
    async fn delete(&self, id: &BlockId) -> Result<u64> {
        let s = self.shared.clone();
        let id = id.clone();
        blocking(move || Ok(s.delete(&id))).await
    }
    fn stats(&self) -> TierStats {
        tier_stats(&self.shared.index.lock(), self.shared.cfg.capacity.bytes())
    }
}
