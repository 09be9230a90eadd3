//! How blocks leave the disk tier: leaf-first eviction under its byte
//! budget (never a chain's own ancestors, never pinned blocks; also on a
//! restart with a smaller capacity), a property test that chains stay
//! prefix-closed on disk, TTL expiry, cascading delete, and replace.
mod common;
use bytes::Bytes;
use common::disk::{cfg, chain_blocks, cost, open, walk};
use common::ns;
use kvtier_core::disk::SyncMode;
use kvtier_core::error::ErrorKind;
use kvtier_core::memory::{Overwrite, unix_ms};
use kvtier_core::*;
use proptest::prelude::*;
use std::time::Duration;

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
