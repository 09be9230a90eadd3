//! Corruption against the real binary with a disk tier (docs/durability.md):
//! a byte flipped in a record while the server is stopped, or while it runs
//! and the block is only on disk, is a miss, never wrong bytes; the chain
//! stops at the corrupt block, the rest is intact, a re-write repairs it.
mod common;

use common::disk::{NS, chain, key, log_field, payload_for, runtime, start, verify_chains};
use kvtier_client::Tier;
use kvtier_core::Key;
use std::path::{Path, PathBuf};

/// Finds the record file holding `key` by parsing headers (docs/disk-format.md).
fn record_file(dir: &Path, key: &[u8]) -> (PathBuf, usize, usize) {
    let mut found = None;
    for shard in std::fs::read_dir(dir.join("blocks")).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_none_or(|e| e != "kvb") {
                continue;
            }
            let buf = std::fs::read(&p).unwrap();
            assert_eq!(&buf[0..4], b"KVTB");
            let h = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
            let plen = u64::from_le_bytes(buf[20..28].try_into().unwrap()) as usize;
            let n = u16::from_le_bytes(buf[44..46].try_into().unwrap()) as usize;
            let k = u16::from_le_bytes(buf[46..48].try_into().unwrap()) as usize;
            assert_eq!(buf.len(), h + plen, "{}", p.display());
            if &buf[52..52 + n] == NS.as_bytes() && &buf[52 + n..52 + n + k] == key {
                assert!(found.is_none(), "one record per key");
                found = Some((p, h, plen));
            }
        }
    }
    found.expect("record file for key")
}

fn flip_byte(path: &Path, at: usize) {
    let mut buf = std::fs::read(path).unwrap();
    buf[at] ^= 0x40;
    std::fs::write(path, buf).unwrap();
}

/// A byte flipped in a stored payload while the server is stopped: that block
/// is missing after restart (never returned), everything else is intact.
#[test]
fn corruption_while_stopped_is_a_miss_not_wrong_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    let args = ["--disk-sync", "always", "--memory-capacity", "64MiB"];
    let singles: Vec<Vec<Key>> = (0..8).map(|i| vec![key(&[1, i])]).collect();
    let chain3: Vec<Key> = (0..3).map(|i| key(&[2, i])).collect();
    let s = start(&dir, &log, &args);
    let rt = runtime();
    rt.block_on(async {
        let c = s.client().await;
        for ks in singles.iter().chain([&chain3]) {
            c.write(NS, &chain(ks)).await.unwrap();
        }
    });
    s.stop();
    // Corrupt one single block and the middle of the chain.
    for k in [&singles[3][0], &chain3[1]] {
        let (p, h, plen) = record_file(&dir, k.as_bytes());
        flip_byte(&p, h + plen / 2);
    }
    let s = start(&dir, &log, &args);
    let log_text = s.stderr();
    assert_eq!(
        log_field(&log_text, "disk tier recovered", "corrupt"),
        Some(2),
        "{log_text}"
    );
    assert!(log_text.contains("dropping corrupt record"), "{log_text}");
    assert_eq!(
        s.metric("kvtier_disk_recovery_dropped_files{reason=\"corrupt\"}"),
        2.0
    );
    assert_eq!(
        s.metric("kvtier_disk_recovered_blocks"),
        9.0,
        "8 + 3 stored, 2 dropped"
    );
    rt.block_on(async {
        let c = s.client().await;
        let bad = &singles[3];
        let l = c.lookup(NS, bad, None).await.unwrap();
        assert_eq!(l.found, 0, "the corrupt block is reported missing");
        let r = c.read(NS, bad, 0).await.unwrap();
        assert!(r.blocks.is_empty() && r.partial, "never returned");
        let l = c.lookup(NS, &chain3, None).await.unwrap();
        assert_eq!(l.found, 1, "the chain stops at the corrupt block");
        let r = c.read(NS, &chain3, 0).await.unwrap();
        assert_eq!(r.blocks.len(), 1);
        assert!(r.blocks[0].payload == payload_for(chain3[0].as_bytes()));
        let good: Vec<Vec<Key>> = singles
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 3)
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(verify_chains(&c, &good, "intact").await, 7);
        // Re-writing the block repairs it.
        c.write(NS, &chain(bad)).await.unwrap();
        assert_eq!(
            verify_chains(&c, std::slice::from_ref(bad), "repaired").await,
            1
        );
    });
    s.stop();

    // Corruption after open (the server is running, the record is not in
    // memory): detected on read, served as a miss, counted.
    let args_small_mem = [
        "--disk-sync",
        "always",
        "--memory-capacity",
        "1MiB",
        "--max-block-size",
        "1MiB",
    ];
    let s = start(&dir, &log, &args_small_mem);
    let victim = &singles[5];
    let (p, h, plen) = record_file(&dir, victim[0].as_bytes());
    flip_byte(&p, h + plen - 1);
    rt.block_on(async {
        let c = s.client().await;
        let l = c.lookup(NS, victim, None).await.unwrap();
        assert_eq!(
            (l.found, l.tiers.as_slice()),
            (1, &[Tier::Disk][..]),
            "lookups trust the index"
        );
        let r = c.read(NS, victim, 0).await.unwrap();
        assert!(
            r.blocks.is_empty(),
            "bytes that fail their checksum are never returned"
        );
        assert_eq!(
            c.lookup(NS, victim, None).await.unwrap().found,
            0,
            "and the record is gone"
        );
    });
    assert_eq!(s.metric("kvtier_disk_corrupt_on_read_total"), 1.0);
    assert!(!p.exists(), "the corrupt file is unlinked");
    s.stop();
}
