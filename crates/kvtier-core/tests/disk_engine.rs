//! The engine over a disk tier: blocks demoted from memory are found and
//! promoted back from disk under write-through and write-back, write-through
//! survives a restart and stores chains longer than memory, and a full disk
//! degrades writes unless `sync = always` (then it refuses them).
mod common;
use common::disk::{cfg, chain_blocks, cost, open};
use common::ns;
use kvtier_core::disk::SyncMode;
use kvtier_core::error::ErrorKind;
use kvtier_core::*;
use std::sync::Arc;
use std::time::Duration;

fn engine_cfg(mem: u64) -> EngineConfig {
    EngineConfig {
        memory_capacity: ByteSize(mem),
        // These tests pin whole tiers on purpose (the default caps pins at
        // half the memory tier: tests/engine.rs).
        max_pinned: ByteSize::gib(1024),
        ..Default::default()
    }
}

#[tokio::test]
async fn engine_demotes_to_disk_and_promotes_on_read() {
    for policy in [WritePolicy::WriteThrough, WritePolicy::WriteBack] {
        let dir = tempfile::tempdir().unwrap();
        let size = 100_000;
        let (disk, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Never));
        // Memory holds 3 blocks: writing chain b evicts chain a, tail first.
        let e = Engine::builder(engine_cfg(3 * (size as u64 + 300)))
            .disk(Some(Arc::new(disk)), policy)
            .build();
        let n = ns("t");
        let a = chain_blocks(&n, 1, 3, size);
        let b = chain_blocks(&n, 2, 3, size);
        let mut t = StorageTiming::default();
        for x in a.iter().chain(&b) {
            assert_eq!(
                e.write(x.clone(), &mut t).await.unwrap(),
                WriteOutcome::Stored,
                "{policy:?}"
            );
        }
        assert_eq!(
            e.write(b[0].clone(), &mut t).await.unwrap(),
            WriteOutcome::Existing
        );
        let keys = |c: &[Block]| {
            c.iter()
                .map(|x| x.meta.id.key.clone())
                .collect::<Vec<Key>>()
        };
        let out = e.lookup(&n, &keys(&a), None, &mut t).await.unwrap();
        assert_eq!(
            out.tiers,
            vec![TierKind::Disk; 3],
            "{policy:?}: evicted from memory, found on disk"
        );
        let out = e.lookup(&n, &keys(&b), None, &mut t).await.unwrap();
        assert_eq!(out.tiers, vec![TierKind::Memory; 3], "{policy:?}");
        let mut t = StorageTiming::default();
        let (got, tier) = e.read(&a[0].meta.id, &mut t).await.unwrap().unwrap();
        assert_eq!(
            (tier, &got),
            (TierKind::Disk, &a[0]),
            "byte-identical from disk"
        );
        assert!(t.disk > Duration::ZERO);
        assert!(e.memory().contains_block(&a[0].meta.id), "promoted");
        let (got, tier) = e.read(&a[0].meta.id, &mut t).await.unwrap().unwrap();
        assert_eq!((tier, &got), (TierKind::Memory, &a[0]));
        // Leases cover disk-resident blocks too.
        e.lease(&n, &keys(&a)[1..], Duration::from_secs(1)).unwrap();
        let st = e.stats();
        assert_eq!(st.tiers.len(), 2);
        if policy == WritePolicy::WriteBack {
            // a's three blocks, then b[2] when a[0]'s promotion evicted it.
            assert_eq!((st.demotions, st.tiers[1].1.blocks), (4, 4), "{st:?}");
        } else {
            assert_eq!((st.demotions, st.tiers[1].1.blocks), (0, 6), "{st:?}");
        }
        // Delete reaches both tiers.
        assert_eq!(e.delete(&a[0].meta.id, &mut t).await.unwrap(), 3);
        assert_eq!(
            e.lookup(&n, &keys(&a), None, &mut t).await.unwrap().found,
            0
        );
        e.memory().check_invariants().unwrap();
        e.disk().unwrap().check_invariants().unwrap();
    }
}

#[tokio::test]
async fn engine_write_through_survives_restart_and_long_chains() {
    let dir = tempfile::tempdir().unwrap();
    let n = ns("t");
    let size = 50_000;
    // Memory holds 2 blocks; a chain of 6 is still stored (on disk).
    let chain = chain_blocks(&n, 7, 6, size);
    {
        let (disk, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
        let e = Engine::builder(engine_cfg(2 * (size as u64 + 300)))
            .disk(Some(Arc::new(disk)), WritePolicy::WriteThrough)
            .build();
        let mut t = StorageTiming::default();
        let mut pinned = chain_blocks(&n, 8, 2, size);
        for b in &pinned {
            e.write(b.clone(), &mut t).await.unwrap();
        }
        let keys: Vec<Key> = pinned.iter().map(|b| b.meta.id.key.clone()).collect();
        e.lease(&n, &keys, Duration::from_secs(30)).unwrap();
        // Memory is fully pinned: writes go to disk only.
        for b in &chain {
            e.write(b.clone(), &mut t).await.unwrap();
        }
        pinned.clear();
    }
    let (disk, rep) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
    assert_eq!(rep.blocks, 8);
    let e = Engine::builder(engine_cfg(1 << 30))
        .disk(Some(Arc::new(disk)), WritePolicy::WriteThrough)
        .build();
    let keys: Vec<Key> = chain.iter().map(|b| b.meta.id.key.clone()).collect();
    let mut t = StorageTiming::default();
    let out = e.lookup(&n, &keys, None, &mut t).await.unwrap();
    assert_eq!((out.found, out.tiers[0]), (6, TierKind::Disk));
    for b in &chain {
        assert_eq!(e.read(&b.meta.id, &mut t).await.unwrap().unwrap().0, *b);
    }
}

#[tokio::test]
async fn disk_full_degrades_unless_sync_always() {
    let size = 10_000;
    for sync in [SyncMode::Batch, SyncMode::Always] {
        let dir = tempfile::tempdir().unwrap();
        let (disk, _) = open(cfg(dir.path(), cost(size), SyncMode::Batch));
        drop(disk);
        let (disk, _) = open(cfg(dir.path(), cost(size), sync));
        let e = Engine::builder(engine_cfg(1 << 30))
            .disk(Some(Arc::new(disk)), WritePolicy::WriteThrough)
            .build();
        let n = ns("t");
        let chain = chain_blocks(&n, 1, 2, size);
        let mut t = StorageTiming::default();
        e.write(chain[0].clone(), &mut t).await.unwrap();
        // The disk tier cannot evict the chain's own parent: exhausted on disk.
        let r = e.write(chain[1].clone(), &mut t).await;
        match sync {
            SyncMode::Always => {
                assert_eq!(r.unwrap_err().kind, ErrorKind::ResourceExhausted);
                assert!(
                    !e.memory().contains_block(&chain[1].meta.id),
                    "not acknowledged, not kept"
                );
                assert_eq!(e.stats().degraded_writes, 0);
            }
            _ => {
                assert_eq!(r.unwrap(), WriteOutcome::Stored);
                assert!(e.memory().contains_block(&chain[1].meta.id));
                assert_eq!(e.stats().degraded_writes, 1);
            }
        }
        assert_eq!(e.disk().unwrap().disk_stats().write_exhausted, 1);
        // Reads keep working.
        assert_eq!(
            e.read(&chain[0].meta.id, &mut t).await.unwrap().unwrap().0,
            chain[0]
        );
    }
}
