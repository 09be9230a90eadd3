//! Engine + memory-tier behaviour: prefix-closed eviction (property test), TTLs
//! under paused time, leases, idempotent writes and bad input.
mod common;
use bytes::Bytes;
use common::{chain_with, ns};
use kvtier_core::error::ErrorKind;
use kvtier_core::*;
use proptest::prelude::*;
use std::time::Duration;

fn chain_blocks(ns_: &Namespace, seed: u32, n: usize, size: usize) -> Vec<Block> {
    chain_with(ns_, seed, n, |i| {
        vec![(seed as u8).wrapping_add(i as u8); size]
    })
}

fn engine(cap: u64) -> Engine {
    Engine::new(EngineConfig {
        memory_capacity: ByteSize(cap),
        ..Default::default()
    })
}

/// For every resident block, its parent is resident: the stored set is prefix-closed.
fn assert_prefix_closed(e: &Engine, chains: &[Vec<Block>]) {
    e.memory().check_invariants().unwrap();
    for chain in chains {
        let mut seen_missing = false;
        for b in chain {
            let present = e.memory().contains_block(&b.meta.id);
            assert!(
                !(present && seen_missing),
                "block {:?} resident after a missing ancestor",
                b.meta.id
            );
            seen_missing |= !present;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn eviction_keeps_chains_prefix_closed(
        ops in prop::collection::vec((0u32..12, 1usize..10, 0usize..3), 1..60),
        cap_blocks in 3u64..40,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let size = 1000;
            let e = engine(cap_blocks * (size as u64 + 300));
            let n = ns("prop");
            let mut chains = Vec::new();
            for (seed, len, action) in ops {
                let chain = chain_blocks(&n, seed, len, size);
                let mut t = StorageTiming::default();
                match action {
                    // write the chain head first
                    // write the chain head first; a chain longer than memory gets
                    // RESOURCE_EXHAUSTED for the tail that cannot fit
                    0 | 1 => for b in &chain {
                        if let Err(err) = e.write(b.clone(), &mut t).await {
                            assert_eq!(err.kind, ErrorKind::ResourceExhausted, "{}", err.message);
                            break;
                        }
                    },
                    // look the chain up (touches its prefix)
                    _ => {
                        let keys: Vec<Key> = chain.iter().map(|b| b.meta.id.key.clone()).collect();
                        e.lookup(&n, &keys, None, &mut t).await.unwrap();
                    }
                }
                chains.push(chain);
                assert_prefix_closed(&e, &chains);
            }
            let st = e.memory().stats_snapshot();
            prop_assert!(st.bytes <= cap_blocks * (size as u64 + 300));
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn write_read_lookup_roundtrip() {
    let e = engine(1 << 30);
    let n = ns("t");
    let chain = chain_blocks(&n, 1, 5, 1_200_000);
    let mut t = StorageTiming::default();
    for b in &chain[..3] {
        assert_eq!(
            e.write(b.clone(), &mut t).await.unwrap(),
            WriteOutcome::Stored
        );
    }
    // idempotent
    assert_eq!(
        e.write(chain[0].clone(), &mut t).await.unwrap(),
        WriteOutcome::Existing
    );
    let keys: Vec<Key> = chain.iter().map(|b| b.meta.id.key.clone()).collect();
    let out = e.lookup(&n, &keys, None, &mut t).await.unwrap();
    assert_eq!(out.found, 3);
    assert_eq!(out.tiers, vec![TierKind::Memory; 3]);
    let (b, tier) = e.read(&chain[1].meta.id, &mut t).await.unwrap().unwrap();
    assert_eq!(tier, TierKind::Memory);
    assert_eq!(b.payload, chain[1].payload);
    assert!(e.read(&chain[4].meta.id, &mut t).await.unwrap().is_none());
    // another namespace sees nothing
    assert_eq!(
        e.lookup(&ns("other"), &keys, None, &mut t)
            .await
            .unwrap()
            .found,
        0
    );
    // conflicting re-write is rejected, original kept
    let mut bad = chain[0].clone();
    bad.payload = Bytes::from(vec![9u8; 10]);
    bad.meta.crc32c = crc32c::crc32c(&bad.payload);
    assert_eq!(
        e.write(bad, &mut t).await.unwrap_err().kind,
        ErrorKind::FailedPrecondition
    );
    assert_eq!(
        e.read(&chain[0].meta.id, &mut t)
            .await
            .unwrap()
            .unwrap()
            .0
            .payload,
        chain[0].payload
    );
}

#[tokio::test]
async fn oversized_payload_is_rejected_naming_the_limit() {
    let e = Engine::new(EngineConfig {
        max_block_size: ByteSize(1000),
        ..Default::default()
    });
    let n = ns("t");
    let b = Block::new(
        BlockId::new(n, Key::new(&b"k"[..]).unwrap()),
        None,
        0,
        Bytes::from(vec![0u8; 1001]),
    );
    let err = e.write(b, &mut StorageTiming::default()).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("1000"), "{}", err.message);
}

#[tokio::test(start_paused = true)]
async fn ttl_expires_under_paused_time() {
    let e = engine(1 << 20);
    let n = ns("t");
    let mut b = Block::new(
        BlockId::new(n.clone(), Key::new(&b"k"[..]).unwrap()),
        None,
        0,
        Bytes::from_static(b"v"),
    );
    b.meta.expires_unix_ms = Some(kvtier_core::memory::unix_ms() + 1000);
    let mut t = StorageTiming::default();
    e.put_value(b.clone(), &mut t).await.unwrap();
    tokio::time::advance(Duration::from_millis(990)).await;
    assert!(e.read(&b.meta.id, &mut t).await.unwrap().is_some());
    tokio::time::advance(Duration::from_millis(20)).await;
    assert!(e.read(&b.meta.id, &mut t).await.unwrap().is_none());
    assert_eq!(e.memory().stats_snapshot().expirations, 1);
}

#[tokio::test(start_paused = true)]
async fn expiring_parent_takes_descendants_with_it() {
    let e = engine(1 << 24);
    let n = ns("t");
    let mut chain = chain_blocks(&n, 3, 3, 100);
    chain[0].meta.expires_unix_ms = Some(kvtier_core::memory::unix_ms() + 50);
    let mut t = StorageTiming::default();
    for b in &chain {
        e.write(b.clone(), &mut t).await.unwrap();
    }
    tokio::time::advance(Duration::from_millis(60)).await;
    assert_eq!(e.purge_expired(), 3);
    assert!(e.read(&chain[2].meta.id, &mut t).await.unwrap().is_none());
    e.memory().check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn lease_pins_prefix_until_it_expires() {
    let size = 1000usize;
    let e = engine(4 * (size as u64 + 300));
    let n = ns("t");
    let leased = chain_blocks(&n, 1, 2, size);
    let mut t = StorageTiming::default();
    for b in &leased {
        e.write(b.clone(), &mut t).await.unwrap();
    }
    let keys: Vec<Key> = leased.iter().map(|b| b.meta.id.key.clone()).collect();
    let out = e
        .lookup(&n, &keys, Some(Duration::from_millis(500)), &mut t)
        .await
        .unwrap();
    let lease = out.lease.expect("lease granted");
    // Flood memory with other chains: the leased prefix must survive.
    for s in 10..20 {
        for b in chain_blocks(&n, s, 2, size) {
            e.write(b, &mut t).await.unwrap();
        }
    }
    assert_eq!(e.lookup(&n, &keys, None, &mut t).await.unwrap().found, 2);
    e.check_lease(lease.id).unwrap();
    // After expiry the pin is gone and reading with the lease fails clearly.
    tokio::time::advance(Duration::from_millis(501)).await;
    let err = e.check_lease(lease.id).unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
    assert!(err.message.contains("expired"), "{}", err.message);
    for s in 20..30 {
        for b in chain_blocks(&n, s, 2, size) {
            e.write(b, &mut t).await.unwrap();
        }
    }
    assert_eq!(e.lookup(&n, &keys, None, &mut t).await.unwrap().found, 0);
}

#[tokio::test]
async fn lease_on_missing_key_is_not_found() {
    let e = engine(1 << 20);
    let err = e
        .lease(
            &ns("t"),
            &[Key::new(&b"nope"[..]).unwrap()],
            Duration::from_secs(1),
        )
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound);
    assert!(err.message.contains("nope"));
    // A lookup that finds nothing grants no lease (a miss is not an error).
    let out = e
        .lookup(
            &ns("t"),
            &[Key::new(&b"nope"[..]).unwrap()],
            Some(Duration::from_secs(1)),
            &mut StorageTiming::default(),
        )
        .await
        .unwrap();
    assert_eq!((out.found, out.lease), (0, None));
}

#[tokio::test]
async fn everything_pinned_means_resource_exhausted() {
    // Only when the operator lets leases pin the whole tier (the default
    // caps pins at half of it: see the lease flood test below).
    let size = 1000usize;
    let cap = 2 * (size as u64 + 300);
    let e = Engine::new(EngineConfig {
        memory_capacity: ByteSize(cap),
        max_pinned: ByteSize(cap),
        ..Default::default()
    });
    let n = ns("t");
    let chain = chain_blocks(&n, 1, 2, size);
    let mut t = StorageTiming::default();
    for b in &chain {
        e.write(b.clone(), &mut t).await.unwrap();
    }
    let keys: Vec<Key> = chain.iter().map(|b| b.meta.id.key.clone()).collect();
    e.lease(&n, &keys, Duration::from_secs(10)).unwrap();
    let other = chain_blocks(&n, 2, 1, size).remove(0);
    let err = e.write(other, &mut t).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ResourceExhausted);
    assert_eq!(e.lookup(&n, &keys, None, &mut t).await.unwrap().found, 2);
    e.memory().check_invariants().unwrap();
}

fn keys_of(chain: &[Block]) -> Vec<Key> {
    chain.iter().map(|b| b.meta.id.key.clone()).collect()
}

#[tokio::test]
async fn a_lease_flood_from_one_namespace_leaves_others_writes_working() {
    // 8 blocks of memory; namespace "a" fills it and leases everything it
    // can, again and again (renewing); "b" must still be able to write.
    let size = 1000usize;
    let block = size as u64 + 300;
    let e = engine(8 * block);
    let (a, b) = (ns("a"), ns("b"));
    let mut t = StorageTiming::default();
    let chains: Vec<Vec<Block>> = (0..4).map(|s| chain_blocks(&a, s, 2, size)).collect();
    for c in &chains {
        for blk in c {
            e.write(blk.clone(), &mut t).await.unwrap();
        }
    }
    let mut pinned_found = 0;
    for _round in 0..3 {
        for c in &chains {
            let out = e
                .lookup(&a, &keys_of(c), Some(Duration::from_secs(60)), &mut t)
                .await
                .unwrap();
            // Only what could be pinned is reported found, with a lease on it.
            assert_eq!(out.lease.is_some(), out.found > 0);
            pinned_found += out.found;
        }
        let _ = e.lease(&a, &keys_of(&chains[0]), Duration::from_secs(60));
    }
    let stats = e.stats();
    assert!(stats.pinned_bytes <= 4 * block, "{}", stats.pinned_bytes);
    assert!(stats.lease_refusals > 0);
    assert!(pinned_found >= 2, "some of the flood was pinned");
    // "b" writes 8 blocks' worth: every write succeeds (evicting a's unpinned blocks).
    for s in 0..4 {
        for blk in chain_blocks(&b, 100 + s, 2, size) {
            e.write(blk, &mut t).await.expect("b's write");
        }
    }
    e.memory().check_invariants().unwrap();
}

/// An engine of 16 blocks' memory whose namespaces may each pin 2 blocks of
/// the returned payload size.
fn two_block_pin_cap() -> (Engine, usize) {
    let size = 1000usize;
    let block = size as u64 + 300;
    let e = Engine::new(EngineConfig {
        memory_capacity: ByteSize(16 * block),
        max_pinned_per_namespace: ByteSize(2 * block),
        ..Default::default()
    });
    (e, size)
}

#[tokio::test]
async fn per_namespace_pin_cap_truncates_lookups_and_refuses_leases() {
    let (e, size) = two_block_pin_cap();
    let (a, b) = (ns("a"), ns("b"));
    let mut t = StorageTiming::default();
    let ca = chain_blocks(&a, 1, 3, size);
    let cb = chain_blocks(&b, 2, 2, size);
    for blk in ca.iter().chain(&cb) {
        e.write(blk.clone(), &mut t).await.unwrap();
    }
    // a's 3-block prefix: only 2 fit its cap, so 2 are found and pinned.
    let out = e
        .lookup(&a, &keys_of(&ca), Some(Duration::from_secs(60)), &mut t)
        .await
        .unwrap();
    assert_eq!(out.found, 2);
    assert_eq!(out.tiers.len(), 2);
    assert!(out.lease.is_some());
    // Without a lease the whole prefix is found.
    assert_eq!(
        e.lookup(&a, &keys_of(&ca), None, &mut t)
            .await
            .unwrap()
            .found,
        3
    );
    // a's cap is spent: an explicit lease is refused with a clear error...
    let err = e
        .lease(&a, &keys_of(&ca[..1]), Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ResourceExhausted);
    assert!(
        err.message.contains("max_pinned_per_namespace"),
        "{}",
        err.message
    );
    // ...while b's leases are unaffected.
    let out = e
        .lookup(&b, &keys_of(&cb), Some(Duration::from_secs(60)), &mut t)
        .await
        .unwrap();
    assert_eq!(out.found, 2);
}

#[tokio::test]
async fn a_refused_lease_keeps_no_charge() {
    // A lease that does not fit whole is refused; the bytes reserved for its
    // leading blocks while deciding go back at once, not at its deadline.
    let (e, size) = two_block_pin_cap();
    let a = ns("a");
    let mut t = StorageTiming::default();
    let ca = chain_blocks(&a, 1, 4, size);
    for blk in &ca {
        e.write(blk.clone(), &mut t).await.unwrap();
    }
    for _ in 0..3 {
        let err = e
            .lease(&a, &keys_of(&ca), Duration::from_secs(60))
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::ResourceExhausted);
        assert_eq!(e.stats().pinned_bytes, 0, "a refused lease holds nothing");
    }
    // So a lease that fits is still granted.
    e.lease(&a, &keys_of(&ca[..1]), Duration::from_secs(60))
        .expect("one block fits the cap");
}

#[tokio::test]
async fn pinning_a_chain_tail_charges_its_ancestors() {
    // Eviction takes leaves only, so pinning the last block of a chain keeps
    // the whole chain: the charge must say so.
    let size = 1000usize;
    let block = size as u64 + 300;
    let e = engine(16 * block);
    let n = ns("t");
    let mut t = StorageTiming::default();
    let chain = chain_blocks(&n, 3, 4, size);
    for blk in &chain {
        e.write(blk.clone(), &mut t).await.unwrap();
    }
    e.lease(&n, &keys_of(&chain[3..]), Duration::from_secs(60))
        .unwrap();
    let pinned = e.stats().pinned_bytes;
    assert!(pinned >= 4 * size as u64, "{pinned}");
}

#[tokio::test]
async fn delete_cascades_to_descendants() {
    let e = engine(1 << 24);
    let n = ns("t");
    let chain = chain_blocks(&n, 5, 4, 10);
    let mut t = StorageTiming::default();
    for b in &chain {
        e.write(b.clone(), &mut t).await.unwrap();
    }
    assert_eq!(e.delete(&chain[1].meta.id, &mut t).await.unwrap(), 3);
    let keys: Vec<Key> = chain.iter().map(|b| b.meta.id.key.clone()).collect();
    assert_eq!(e.lookup(&n, &keys, None, &mut t).await.unwrap().found, 1);
    e.memory().check_invariants().unwrap();
}

#[tokio::test]
async fn child_written_before_parent_is_adopted() {
    let e = engine(1 << 24);
    let n = ns("t");
    let chain = chain_blocks(&n, 6, 3, 10);
    let mut t = StorageTiming::default();
    for b in chain.iter().rev() {
        e.write(b.clone(), &mut t).await.unwrap();
    }
    e.memory().check_invariants().unwrap();
    assert_eq!(e.delete(&chain[0].meta.id, &mut t).await.unwrap(), 3);
}

#[tokio::test]
async fn releasing_a_lease_gives_its_pin_budget_back() {
    // A client that looks up with a lease, reads and releases, over and over,
    // must keep getting hits: released leases neither hold the pin budget
    // nor their pins until their deadline.
    let size = 1000usize;
    let block = size as u64 + 300;
    let e = engine(8 * block); // pin budget: 4 blocks
    let n = ns("t");
    let mut t = StorageTiming::default();
    let chain = chain_blocks(&n, 9, 3, size);
    for b in &chain {
        e.write(b.clone(), &mut t).await.unwrap();
    }
    for round in 0..10 {
        let out = e
            .lookup(&n, &keys_of(&chain), Some(Duration::from_secs(60)), &mut t)
            .await
            .unwrap();
        assert_eq!(out.found, 3, "round {round}: the budget was given back");
        e.release_lease(out.lease.unwrap().id).unwrap();
    }
    assert_eq!(e.stats().pinned_bytes, 0);
    // The pins were lifted too: memory can evict the chain for new writes.
    for s in 20..30 {
        for b in chain_blocks(&n, s, 1, size) {
            e.write(b, &mut t).await.unwrap();
        }
    }
    assert!(
        e.lookup(&n, &keys_of(&chain), None, &mut t)
            .await
            .unwrap()
            .found
            < 3
    );
    e.memory().check_invariants().unwrap();
}
