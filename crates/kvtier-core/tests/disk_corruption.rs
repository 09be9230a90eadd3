//! Damaged disk records are never served (docs/durability.md): a record torn
//! by a crash, a bit flipped in a payload or a header while the tier was
//! stopped or while it runs, a record file that vanished. Each is dropped,
//! counted, and takes its descendants with it (chains stay prefix-closed).
mod common;
use common::disk::{cfg, chain_blocks, open, walk};
use common::ns;
use kvtier_core::disk::{DiskConfig, SyncMode, format};
use kvtier_core::tier::PutOutcome;
use kvtier_core::*;
use std::path::{Path, PathBuf};

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
