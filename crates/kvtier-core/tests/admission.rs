//! Admission to the lower tiers (docs/cache-choice.md): under `reuse` and
//! `tinylfu` a block written once and never used again never costs a disk
//! write or an upload; a block used again is written down; a write says
//! which of its blocks it kept in memory only.
mod common;
use async_trait::async_trait;
use common::disk::chain_blocks;
use common::ns;
use kvtier_core::tier::PutOutcome;
use kvtier_core::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: usize = 4 << 20;

/// An in-memory object store counting its PUTs.
#[derive(Default)]
struct Store {
    blocks: Mutex<HashMap<BlockId, Block>>,
    puts: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl Tier for Store {
    fn kind(&self) -> TierKind {
        TierKind::Object
    }
    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        Ok(self.blocks.lock().get(id).cloned())
    }
    async fn contains(&self, id: &BlockId) -> Result<bool> {
        Ok(self.blocks.lock().contains_key(id))
    }
    async fn put(&self, block: Block) -> Result<PutOutcome> {
        self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.blocks.lock().insert(block.meta.id.clone(), block);
        Ok(PutOutcome::Stored)
    }
    async fn delete(&self, id: &BlockId) -> Result<u64> {
        Ok(self.blocks.lock().remove(id).map_or(0, |_| 1))
    }
    fn stats(&self) -> TierStats {
        TierStats::default()
    }
}

/// A 64 MiB memory tier over a disk tier in `dir` (write-through, as
/// `kvtier serve` defaults) and, if given, `store` written back.
fn engine(
    dir: &std::path::Path,
    disk: Admission,
    store: Option<(&Arc<Store>, Admission)>,
) -> Engine {
    let cfg = EngineConfig {
        memory_capacity: ByteSize::mib(64),
        ..EngineConfig::default()
    };
    let (disk_tier, _) = DiskTier::open(DiskConfig::new(dir, ByteSize::gib(1))).unwrap();
    let object = store.map_or(Admission::All, |(_, a)| a);
    let mut b = Engine::builder(cfg)
        .admission(disk, object)
        .disk(Some(Arc::new(disk_tier)), WritePolicy::WriteThrough);
    if let Some((s, _)) = store {
        b = b.object(s.clone(), ObjectOptions::default());
    }
    b.build()
}

/// One block of its own chain per seed (so any of them may be evicted).
fn block(seed: u32) -> Block {
    chain_blocks(&ns("adm"), seed, 1, BLOCK).remove(0)
}

async fn write(e: &Engine, b: &Block) -> u32 {
    let mut t = StorageTiming::default();
    e.write(b.clone(), &mut t).await.expect("stored");
    t.deferred
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn on_disk(e: &Engine, b: &Block) -> bool {
    e.disk().unwrap().has(&b.meta.id)
}

fn stats(e: &Engine, tier: TierKind) -> AdmissionStats {
    e.admission_stats()
        .into_iter()
        .find(|(t, _, _)| *t == tier)
        .map(|(_, _, s)| s)
        .unwrap()
}

#[tokio::test]
async fn blocks_written_once_never_reach_the_disk_under_reuse_and_all_do_under_all() {
    for policy in [Admission::Reuse, Admission::All] {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path(), policy, None);
        // 24 blocks of 4 MiB through 64 MiB of memory: the first ones are evicted.
        let blocks: Vec<Block> = (0..24).map(block).collect();
        let mut deferred = 0;
        for b in &blocks {
            deferred += write(&e, b).await;
        }
        let written = blocks.iter().filter(|b| on_disk(&e, b)).count();
        let s = stats(&e, TierKind::Disk);
        if policy == Admission::All {
            assert_eq!(
                (written, deferred),
                (24, 0),
                "all: every write goes down at once"
            );
            assert_eq!(s.admitted, 24);
        } else {
            assert_eq!(
                (written, deferred),
                (0, 24),
                "reuse: no block was used twice"
            );
            assert_eq!(s.deferred, 24);
            assert!(s.rejected >= 8, "evicted blocks are rejected: {s:?}");
            assert_eq!(s.admitted, 0);
        }
    }
}

#[tokio::test]
async fn a_block_read_again_or_written_again_is_written_down() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), Admission::Reuse, None);
    let (a, b) = (block(1), block(2));
    assert_eq!(write(&e, &a).await, 1, "deferred");
    assert_eq!(write(&e, &b).await, 1, "deferred");
    assert!(!on_disk(&e, &a) && !on_disk(&e, &b));
    // A read is a second use: written down in the background.
    let mut t = StorageTiming::default();
    let (got, tier) = e.read(&a.meta.id, &mut t).await.unwrap().unwrap();
    assert_eq!((got.payload.len(), tier), (BLOCK, TierKind::Memory));
    until("the read block on disk", || on_disk(&e, &a)).await;
    // A re-write is one too, and writes through before it is answered.
    assert_eq!(write(&e, &b).await, 0, "admitted: not deferred");
    assert!(on_disk(&e, &b), "written through before the answer");
    // Evicted from memory now, both are still served (from disk).
    for s in 100..120 {
        write(&e, &block(s)).await;
    }
    for x in [&a, &b] {
        let (got, tier) = e.read(&x.meta.id, &mut t).await.unwrap().unwrap();
        assert_eq!((tier, got.payload), (TierKind::Disk, x.payload.clone()));
    }
}

#[tokio::test]
async fn the_sketch_admits_a_block_written_again_after_memory_dropped_it() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path(), Admission::Frequency, None);
    let c = block(7);
    assert_eq!(write(&e, &c).await, 1);
    for s in 200..224 {
        write(&e, &block(s)).await;
    }
    assert!(!e.memory().contains_block(&c.meta.id), "evicted");
    assert!(!on_disk(&e, &c), "and never written down");
    assert!(stats(&e, TierKind::Disk).rejected >= 1);
    // The second write of it: the sketch still counts the first.
    assert_eq!(write(&e, &c).await, 0);
    assert!(on_disk(&e, &c));
}

#[tokio::test]
async fn the_object_store_gets_only_blocks_used_again_under_reuse() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::default());
    let e = engine(dir.path(), Admission::All, Some((&store, Admission::Reuse)));
    let (a, b) = (block(11), block(12));
    assert_eq!(write(&e, &a).await, 1, "the upload is deferred");
    assert_eq!(write(&e, &b).await, 1);
    assert!(e.flush_object_uploads(Duration::from_secs(5)).await);
    assert_eq!(store.puts.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(on_disk(&e, &a), "the disk's own policy (all) still took it");
    let mut t = StorageTiming::default();
    e.read(&a.meta.id, &mut t).await.unwrap().unwrap();
    until("the read block uploaded", || {
        store.blocks.lock().contains_key(&a.meta.id)
    })
    .await;
    assert!(e.flush_object_uploads(Duration::from_secs(5)).await);
    assert_eq!(
        store.puts.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "only the block used again"
    );
    // More uses do not upload it again.
    e.read(&a.meta.id, &mut t).await.unwrap().unwrap();
    assert_eq!(write(&e, &a).await, 0);
    assert!(e.flush_object_uploads(Duration::from_secs(5)).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.puts.load(std::sync::atomic::Ordering::Relaxed), 1);
    let s = stats(&e, TierKind::Object);
    assert_eq!((s.admitted, s.deferred), (1, 2), "{s:?}");
    assert_eq!(s.admitted_bytes, BLOCK as u64);
}
