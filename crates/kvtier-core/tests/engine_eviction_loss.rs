//! Blocks memory evicts are not lost on the way: not when the write that
//! evicted them fails to fit, and not when that write's caller gives up
//! while they are being demoted to disk (under write-back the disk copy is
//! their only one).
mod common;
use common::{chain_with, ns};
use kvtier_core::error::ErrorKind;
use kvtier_core::*;
use std::sync::Arc;
use std::time::Duration;

const UNIT: usize = 1000;

fn cfg(memory: u64) -> EngineConfig {
    EngineConfig {
        memory_capacity: ByteSize(memory),
        max_block_size: ByteSize::mib(1),
        ..Default::default()
    }
}

/// Room for four one-unit blocks (payload, 32-byte key, entry overhead).
fn four_units() -> u64 {
    4 * (UNIT as u64 + 32 + memory::ENTRY_OVERHEAD)
}

fn write_back(memory: u64, dir: &std::path::Path) -> Engine {
    let (disk, _) = DiskTier::open(DiskConfig::new(dir, ByteSize::gib(1))).unwrap();
    Engine::builder(cfg(memory))
        .disk(Some(Arc::new(disk)), WritePolicy::WriteBack)
        .build()
}

/// A (one unit, alone), then C1 → C2 (one unit each) and C3 (three units,
/// child of C2): C3 can evict only A (C1 and C2 are its ancestors), which
/// does not make room.
async fn fill_then_overflow(e: &Engine) -> (Block, Result<WriteOutcome>) {
    let n = ns("t");
    let a = chain_with(&n, 1, 1, |_| vec![1; UNIT]).remove(0);
    let c = chain_with(&n, 2, 3, |i| vec![2; if i < 2 { UNIT } else { 3 * UNIT }]);
    let mut t = StorageTiming::default();
    e.write(a.clone(), &mut t).await.unwrap();
    e.write(c[0].clone(), &mut t).await.unwrap();
    e.write(c[1].clone(), &mut t).await.unwrap();
    let r = e.write(c[2].clone(), &mut t).await;
    (a, r)
}

#[tokio::test]
async fn a_write_that_does_not_fit_keeps_what_it_evicted() {
    let e = Engine::new(cfg(four_units()));
    let (a, r) = fill_then_overflow(&e).await;
    assert_eq!(r.unwrap_err().kind, ErrorKind::ResourceExhausted);
    assert!(
        e.memory().contains_block(&a.meta.id),
        "a block evicted for a write that then failed is gone"
    );
    e.memory().check_invariants().unwrap();
    assert_eq!(e.memory().stats_snapshot().evictions, 0);
}

#[tokio::test]
async fn under_write_back_a_write_that_does_not_fit_memory_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = write_back(four_units(), dir.path());
    let (a, r) = fill_then_overflow(&e).await;
    // The block that did not fit memory lives on disk.
    assert_eq!(r.unwrap(), WriteOutcome::Stored);
    // A was acknowledged and exists only in memory: it must still be there.
    let got = e.read(&a.meta.id, &mut StorageTiming::default()).await;
    assert_eq!(got.unwrap().map(|b| b.0.payload), Some(a.payload));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demotion_finishes_when_the_writer_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let e = write_back(2 * (UNIT as u64 + 32 + memory::ENTRY_OVERHEAD), dir.path());
    let n = ns("t");
    let a = chain_with(&n, 1, 1, |_| vec![1; UNIT]).remove(0);
    let b = chain_with(&n, 2, 1, |_| vec![2; UNIT]).remove(0);
    let c = chain_with(&n, 3, 1, |_| vec![3; 2 * UNIT]).remove(0);
    let mut t = StorageTiming::default();
    e.write(a.clone(), &mut t).await.unwrap();
    e.write(b.clone(), &mut t).await.unwrap();
    // C evicts both; its caller gives up at the first await, which is the
    // first demotion's disk write.
    let gave_up = tokio::time::timeout(Duration::ZERO, e.write(c, &mut t)).await;
    assert!(gave_up.is_err(), "the write finished without waiting");
    // Both evicted blocks reach the disk all the same.
    let disk = e.disk().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(disk.has(&a.meta.id) && disk.has(&b.meta.id)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "evicted blocks never reached the disk: {:?}",
            (disk.has(&a.meta.id), disk.has(&b.meta.id))
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for x in [&a, &b] {
        let got = e.read(&x.meta.id, &mut StorageTiming::default()).await;
        assert_eq!(got.unwrap().map(|g| g.0.payload), Some(x.payload.clone()));
    }
}
