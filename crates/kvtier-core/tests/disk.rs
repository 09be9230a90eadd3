//! Disk tier: roundtrips, restart recovery, torn and corrupt records, leaf-first
//! eviction under a byte budget, TTLs, bad directories and the engine on top.
mod common;
use bytes::Bytes;
use common::{chain_with, ns};
use kvtier_core::disk::{DiskConfig, DiskTier, SyncMode, format};
use kvtier_core::error::ErrorKind;
use kvtier_core::memory::{Overwrite, unix_ms};
use kvtier_core::tier::PutOutcome;
use kvtier_core::*;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Payload bytes vary within a block, so a torn or shifted record shows.
fn chain_blocks(ns_: &Namespace, seed: u32, n: usize, size: usize) -> Vec<Block> {
    chain_with(ns_, seed, n, |i| {
        (0..size)
            .map(|j| {
                (j as u32)
                    .wrapping_mul(31)
                    .wrapping_add(seed * 7 + i as u32) as u8
            })
            .collect()
    })
}

fn cfg(dir: &Path, cap: u64, sync: SyncMode) -> DiskConfig {
    DiskConfig {
        sync,
        ..DiskConfig::new(dir, ByteSize(cap))
    }
}

fn open(c: DiskConfig) -> (DiskTier, RecoveryReport) {
    DiskTier::open(c).unwrap()
}

/// The record file currently holding `id`.
fn record_file(dir: &Path, id: &BlockId) -> PathBuf {
    let hash = hex::encode(format::file_hash(id));
    let shard = dir.join("blocks").join(&hash[..2]);
    let mut found: Vec<PathBuf> = std::fs::read_dir(&shard)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with(&hash) && n.ends_with(".kvb")
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

fn flip_byte(path: &Path, from_end: u64) {
    let mut data = std::fs::read(path).unwrap();
    let i = data.len() - from_end as usize;
    data[i] ^= 0x40;
    std::fs::write(path, data).unwrap();
}

/// Charged size of a record with a 1-byte namespace... rounded: tests use
/// payloads that make every record cost exactly `blocks(size)` 4 KiB units.
fn cost(size: usize) -> u64 {
    (size as u64 + 200).div_ceil(4096) * 4096
}

#[tokio::test]
async fn roundtrip_idempotent_and_restart_recovers_everything() {
    let dir = tempfile::tempdir().unwrap();
    let n = ns("t");
    let chain = chain_blocks(&n, 1, 4, 1_200_000);
    {
        let (tier, rep) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
        assert_eq!(rep.blocks, 0);
        for b in &chain {
            assert_eq!(tier.put(b.clone()).await.unwrap(), PutOutcome::Stored);
        }
        assert_eq!(
            tier.put(chain[1].clone()).await.unwrap(),
            PutOutcome::Existing
        );
        let mut other = chain[1].clone();
        other.payload = Bytes::from_static(b"different");
        other.meta.crc32c = crc32c::crc32c(&other.payload);
        assert_eq!(
            tier.put(other).await.unwrap_err().kind,
            ErrorKind::FailedPrecondition
        );
        for b in &chain {
            assert_eq!(tier.get(&b.meta.id).await.unwrap().as_ref(), Some(b));
        }
        assert!(
            tier.get(&BlockId::new(ns("other"), chain[0].meta.id.key.clone()))
                .await
                .unwrap()
                .is_none()
        );
        let st = tier.stats();
        assert_eq!((st.blocks, st.hits, st.misses), (4, 4, 1));
        tier.check_invariants().unwrap();
    }
    let (tier, rep) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
    assert_eq!(rep.blocks, 4);
    assert_eq!(rep.bytes, tier.stats().bytes);
    assert!(rep.bytes >= 4 * 1_200_000);
    assert_eq!(
        (
            rep.dropped(),
            rep.temp_files_removed,
            rep.dropped_superseded
        ),
        (0, 0, 0)
    );
    for b in &chain {
        let got = tier.get(&b.meta.id).await.unwrap().expect("recovered");
        assert_eq!(got, *b, "byte-identical with identical metadata");
    }
    tier.check_invariants().unwrap();
    // A second process cannot open the same directory.
    let err = DiskTier::open(cfg(dir.path(), 1 << 30, SyncMode::Always)).unwrap_err();
    assert!(
        err.message.contains(&dir.path().display().to_string()),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn every_sync_mode_roundtrips_and_recovers() {
    for sync in [SyncMode::Always, SyncMode::Batch, SyncMode::Never] {
        let dir = tempfile::tempdir().unwrap();
        let chain = chain_blocks(&ns("t"), 2, 3, 50_000);
        {
            let (tier, _) = open(cfg(dir.path(), 1 << 30, sync));
            for b in &chain {
                tier.put(b.clone()).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let (tier, rep) = open(cfg(dir.path(), 1 << 30, sync));
        assert_eq!(rep.blocks, 3, "{sync}");
        for b in &chain {
            assert_eq!(
                tier.get(&b.meta.id).await.unwrap().as_ref(),
                Some(b),
                "{sync}"
            );
        }
    }
    assert_eq!("ALWAYS".parse::<SyncMode>().unwrap(), SyncMode::Always);
    assert!(
        "sometimes"
            .parse::<SyncMode>()
            .unwrap_err()
            .message
            .contains("always")
    );
}

#[tokio::test]
async fn torn_record_is_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let chain = chain_blocks(&ns("t"), 3, 3, 100_000);
    {
        let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Never));
        for b in &chain {
            tier.put(b.clone()).await.unwrap();
        }
    }
    // "Crash" mid-payload: the last block's file is cut in half, and a temp file
    // of a write that never committed is left behind.
    let victim = record_file(dir.path(), &chain[2].meta.id);
    let len = std::fs::metadata(&victim).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let tmp = victim.with_extension("tmp");
    std::fs::write(&tmp, b"KVTB partial").unwrap();

    let (tier, rep) = open(cfg(dir.path(), 1 << 30, SyncMode::Never));
    assert_eq!(
        (
            rep.blocks,
            rep.dropped_torn,
            rep.dropped_corrupt,
            rep.dropped()
        ),
        (2, 1, 0, 1)
    );
    assert_eq!(rep.temp_files_removed, 1);
    assert!(!victim.exists() && !tmp.exists());
    assert!(tier.get(&chain[2].meta.id).await.unwrap().is_none());
    for b in &chain[..2] {
        assert_eq!(tier.get(&b.meta.id).await.unwrap().as_ref(), Some(b));
    }
    // The block can be written again.
    assert_eq!(
        tier.put(chain[2].clone()).await.unwrap(),
        PutOutcome::Stored
    );
    tier.check_invariants().unwrap();
}

#[tokio::test]
async fn bit_flip_while_stopped_is_never_served() {
    for verify_on_open in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let chain = chain_blocks(&ns("t"), 4, 2, 30_000);
        {
            let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
            for b in &chain {
                tier.put(b.clone()).await.unwrap();
            }
        }
        flip_byte(&record_file(dir.path(), &chain[1].meta.id), 100);
        let c = DiskConfig {
            verify_on_open,
            ..cfg(dir.path(), 1 << 30, SyncMode::Always)
        };
        let (tier, rep) = open(c);
        if verify_on_open {
            assert_eq!((rep.blocks, rep.dropped_corrupt), (1, 1));
        } else {
            assert_eq!((rep.blocks, rep.dropped_corrupt), (2, 0));
        }
        assert!(tier.get(&chain[1].meta.id).await.unwrap().is_none());
        assert!(!tier.contains(&chain[1].meta.id).await.unwrap());
        assert_eq!(
            tier.get(&chain[0].meta.id).await.unwrap().as_ref(),
            Some(&chain[0])
        );
        tier.check_invariants().unwrap();
    }
}

#[tokio::test]
async fn bit_flip_in_a_header_while_stopped_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let b = chain_blocks(&ns("t"), 5, 1, 10_000).remove(0);
    {
        let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
        tier.put(b.clone()).await.unwrap();
    }
    let path = record_file(dir.path(), &b.meta.id);
    let len = std::fs::metadata(&path).unwrap().len();
    flip_byte(&path, len - 30); // byte 30: inside the fixed header
    let (tier, rep) = open(DiskConfig {
        verify_on_open: false,
        ..cfg(dir.path(), 1 << 30, SyncMode::Always)
    });
    assert_eq!((rep.blocks, rep.dropped_corrupt), (0, 1));
    assert!(tier.get(&b.meta.id).await.unwrap().is_none());
}

#[tokio::test]
async fn bit_flip_while_running_reads_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    let chain = chain_blocks(&ns("t"), 6, 3, 40_000);
    let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Never));
    for b in &chain {
        tier.put(b.clone()).await.unwrap();
    }
    assert!(tier.get(&chain[1].meta.id).await.unwrap().is_some());
    flip_byte(&record_file(dir.path(), &chain[1].meta.id), 1);
    assert!(
        tier.get(&chain[1].meta.id).await.unwrap().is_none(),
        "corrupt bytes must not be served"
    );
    let ds = tier.disk_stats();
    assert_eq!(ds.corrupt_on_read, 1);
    // Removed with its descendant (prefix closure); the head is intact.
    assert!(!tier.contains(&chain[1].meta.id).await.unwrap());
    assert!(!tier.contains(&chain[2].meta.id).await.unwrap());
    assert_eq!(
        tier.get(&chain[0].meta.id).await.unwrap().as_ref(),
        Some(&chain[0])
    );
    assert_eq!(ds.tier.blocks, 1);
    tier.check_invariants().unwrap();
}

#[tokio::test]
async fn a_vanished_record_takes_its_descendants_files_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let chain = chain_blocks(&ns("t"), 8, 3, 10_000);
    let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Never));
    for b in &chain {
        tier.put(b.clone()).await.unwrap();
    }
    std::fs::remove_file(record_file(dir.path(), &chain[1].meta.id)).unwrap();
    assert!(tier.get(&chain[1].meta.id).await.unwrap().is_none());
    assert!(!tier.contains(&chain[2].meta.id).await.unwrap());
    // Only the head's file is left: the tail's is not stranded outside the
    // index (and its capacity accounting).
    let files = walk(&dir.path().join("blocks"));
    assert_eq!(files, vec![record_file(dir.path(), &chain[0].meta.id)]);
    tier.check_invariants().unwrap();
}

#[tokio::test]
async fn full_tier_evicts_leaves_and_refuses_when_nothing_is_evictable() {
    let dir = tempfile::tempdir().unwrap();
    let size = 10_000;
    let (tier, _) = open(cfg(dir.path(), 3 * cost(size), SyncMode::Never));
    let n = ns("t");
    let a = chain_blocks(&n, 1, 2, size);
    let b = chain_blocks(&n, 2, 1, size);
    for x in a.iter().chain(&b) {
        tier.put(x.clone()).await.unwrap();
    }
    // Touch a's tail so b[0] is the LRU leaf; a[0] is never a leaf.
    tier.get(&a[1].meta.id).await.unwrap().unwrap();
    let c = chain_blocks(&n, 3, 1, size).remove(0);
    tier.put(c.clone()).await.unwrap();
    assert!(!tier.has(&b[0].meta.id));
    assert!(tier.has(&a[0].meta.id) && tier.has(&a[1].meta.id) && tier.has(&c.meta.id));
    assert_eq!(tier.stats().evictions, 1);
    // Next victim is a leaf: a[1] (older than c), never a[0] while a[1] is there.
    tier.put(b[0].clone()).await.unwrap();
    assert!(!tier.has(&a[1].meta.id) && tier.has(&a[0].meta.id));
    // A chain longer than the tier: its 4th block cannot evict its own ancestors.
    let long = chain_blocks(&n, 9, 4, size);
    let mut err = None;
    for x in &long {
        if let Err(e) = tier.put(x.clone()).await {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("exhausted");
    assert_eq!(err.kind, ErrorKind::ResourceExhausted);
    assert!(
        err.message.contains("disk tier") && err.message.contains("full"),
        "{}",
        err.message
    );
    assert!(tier.stats().bytes <= 3 * cost(size));
    // A block larger than the whole tier.
    let huge = chain_blocks(&n, 10, 1, 4 * size).remove(0);
    assert_eq!(
        tier.put(huge).await.unwrap_err().kind,
        ErrorKind::ResourceExhausted
    );
    tier.check_invariants().unwrap();
    // Pinned blocks are not evicted.
    let (tier2_dir, n2) = (tempfile::tempdir().unwrap(), ns("p"));
    let (tier2, _) = open(cfg(tier2_dir.path(), 2 * cost(size), SyncMode::Never));
    let pinned = chain_blocks(&n2, 1, 2, size);
    for x in &pinned {
        tier2.put(x.clone()).await.unwrap();
    }
    let ids: Vec<BlockId> = pinned.iter().map(|b| b.meta.id.clone()).collect();
    tier2.pin(&ids, tokio::time::Instant::now() + Duration::from_secs(60));
    let e = tier2
        .put(chain_blocks(&n2, 2, 1, size).remove(0))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert!(e.message.contains("pinned"), "{}", e.message);
}

#[tokio::test]
async fn restart_with_a_smaller_capacity_evicts_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let size = 10_000;
    let chain = chain_blocks(&ns("t"), 1, 5, size);
    {
        let (tier, _) = open(cfg(dir.path(), 10 * cost(size), SyncMode::Never));
        for b in &chain {
            tier.put(b.clone()).await.unwrap();
        }
    }
    let (tier, rep) = open(cfg(dir.path(), 3 * cost(size), SyncMode::Never));
    assert_eq!((rep.blocks, rep.evicted_over_capacity), (3, 2));
    let present: Vec<bool> = chain.iter().map(|b| tier.has(&b.meta.id)).collect();
    assert_eq!(present, [true, true, true, false, false]);
    tier.check_invariants().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn eviction_keeps_chains_prefix_closed_on_disk(
        ops in prop::collection::vec((0u32..10, 1usize..7, 0usize..4), 1..40),
        cap_blocks in 2u64..16,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let size = 3000;
            let cap = cap_blocks * cost(size);
            let dir = tempfile::tempdir().unwrap();
            let (tier, _) = open(cfg(dir.path(), cap, SyncMode::Never));
            let n = ns("prop");
            let mut chains = Vec::new();
            for (seed, len, action) in ops {
                let chain = chain_blocks(&n, seed, len, size);
                match action {
                    0 | 1 => for b in &chain {
                        if let Err(err) = tier.put(b.clone()).await {
                            assert_eq!(err.kind, ErrorKind::ResourceExhausted, "{}", err.message);
                            break;
                        }
                    },
                    2 => for b in &chain {
                        if tier.get(&b.meta.id).await.unwrap().is_none() { break }
                    },
                    _ => { tier.delete(&chain[len / 2].meta.id).await.unwrap(); }
                }
                chains.push(chain);
                tier.check_invariants().unwrap();
                for chain in &chains {
                    let mut missing = false;
                    for b in chain {
                        let present = tier.has(&b.meta.id);
                        assert!(!(present && missing), "{:?} on disk after a missing ancestor", b.meta.id);
                        missing |= !present;
                    }
                }
                prop_assert!(tier.stats().bytes <= cap);
            }
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn uncreatable_dir_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("disk");
    let err = DiskTier::open(cfg(&bad, 1 << 20, SyncMode::Always)).unwrap_err();
    assert!(
        err.message.contains(&bad.display().to_string()),
        "{}",
        err.message
    );
    // The OS error stays reachable as the source, and survives added context.
    let err = err.context("opening the disk tier");
    let io = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the io::Error as source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotADirectory, "{io}");
    let err = DiskTier::open(cfg(&file, 1 << 20, SyncMode::Always)).unwrap_err();
    assert!(
        err.message.contains(&file.display().to_string()),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn foreign_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("FORMAT"), "kvtier-disk-format 99\n").unwrap();
    let err = DiskTier::open(cfg(dir.path(), 1 << 20, SyncMode::Always)).unwrap_err();
    assert!(
        err.message.contains("99") && err.message.contains(&dir.path().display().to_string()),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn ttl_delete_and_replace() {
    let dir = tempfile::tempdir().unwrap();
    let n = ns("t");
    let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
    // TTL: expired = missing, then purged (with its descendants).
    let mut chain = chain_blocks(&n, 1, 3, 1000);
    chain[0].meta.expires_unix_ms = Some(unix_ms() + 150);
    for b in &chain {
        tier.put(b.clone()).await.unwrap();
    }
    assert!(tier.get(&chain[0].meta.id).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(tier.get(&chain[0].meta.id).await.unwrap().is_none());
    assert_eq!(tier.stats().expirations, 3);
    assert_eq!(tier.stats().blocks, 0);
    // Delete cascades.
    let chain = chain_blocks(&n, 2, 4, 1000);
    for b in &chain {
        tier.put(b.clone()).await.unwrap();
    }
    assert_eq!(tier.delete(&chain[1].meta.id).await.unwrap(), 3);
    assert!(tier.has(&chain[0].meta.id) && !tier.has(&chain[3].meta.id));
    // Replace: the newest value wins, also after a restart.
    let key = BlockId::new(n.clone(), Key::new(&b"value"[..]).unwrap());
    for v in [&b"one"[..], b"two"] {
        let b = Block::new(key.clone(), None, 0, Bytes::from_static(v));
        tier.put_with(b, Overwrite::Replace).await.unwrap();
    }
    drop(tier);
    let (tier, rep) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
    assert_eq!(rep.blocks, 2);
    assert_eq!(
        tier.get(&key).await.unwrap().unwrap().payload,
        Bytes::from_static(b"two")
    );
    // The background thread unlinked the expired records' files.
    let files = walk(&dir.path().join("blocks"));
    assert_eq!(files.len(), 2, "{files:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out
}

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

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    /// Mounts a tmpfs of `size` (e.g. "2m"). Needs root (CI runs as root);
    /// without it the test fails, saying so, rather than passing unchecked.
    fn mount(size: &str) -> SmallFs {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("the mount command");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs for a real ENOSPC needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs(dir)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

/// A real `ENOSPC`, on a 2 MiB tmpfs the test mounts: the write that does
/// not fit is RESOURCE_EXHAUSTED, leaves no partial file, and every block
/// stored before it still reads back intact.
#[tokio::test]
async fn enospc_is_resource_exhausted_and_reads_continue() {
    let fs = SmallFs::mount("2m");
    let dir = fs.0.path().join("tier");
    let (tier, _) = open(cfg(&dir, 1 << 40, SyncMode::Always));
    let chain = chain_blocks(&ns("t"), 1, 12, 400_000);
    let mut stored = Vec::new();
    let mut err = None;
    for b in &chain {
        match tier.put(b.clone()).await {
            Ok(_) => stored.push(b.clone()),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("the filesystem must fill up");
    assert_eq!(err.kind, ErrorKind::ResourceExhausted, "{}", err.message);
    assert!(err.message.contains("out of space"), "{}", err.message);
    assert!(!stored.is_empty());
    for b in &stored {
        assert_eq!(tier.get(&b.meta.id).await.unwrap().as_ref(), Some(b));
    }
    assert!(
        walk(&dir.join("blocks"))
            .iter()
            .all(|p| p.extension().unwrap() == "kvb")
    );
    assert_eq!(tier.disk_stats().write_exhausted, 1);
    drop(tier);
    std::fs::remove_dir_all(&dir).unwrap();
}
