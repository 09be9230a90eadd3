//! Disk tier across a restart: what one process stored, idempotently, in
//! every sync mode, the next process opening the directory recovers
//! byte-identical (docs/durability.md); a second process cannot open it while
//! the first holds it. Damaged records: `disk_corruption.rs`.
mod common;
use bytes::Bytes;
use common::disk::{cfg, chain_blocks, open};
use common::ns;
use kvtier_core::disk::{DiskTier, SyncMode};
use kvtier_core::error::ErrorKind;
use kvtier_core::tier::PutOutcome;
use kvtier_core::*;
use std::time::Duration;

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
