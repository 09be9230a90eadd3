//! Capacity shares (docs/security.md, "Capacity shares"): a tenant that
//! writes many times a tier cannot push a quiet tenant below its fair share,
//! in memory or on disk; a tenant alone may fill the tier; configured
//! weights divide a full tier in their ratio; namespaces under one prefix are
//! one tenant; and with the shares off (one tier-wide LRU) the same flood
//! empties the quiet tenant, which is what makes these tests able to fail.
mod common;
use common::disk::{cfg, chain_blocks, cost};
use common::{chain_with, ns};
use kvtier_core::disk::SyncMode;
use kvtier_core::memory::{ENTRY_OVERHEAD, MemoryTier, Overwrite};
use kvtier_core::*;
use std::sync::Arc;

const BLOCK: usize = 64 << 10;
/// Room for 32 blocks.
const TIER: u64 = 32 * (BLOCK as u64 + 64 + ENTRY_OVERHEAD);

fn chain(ns_: &str, seed: u32, n: usize) -> Vec<Block> {
    chain_with(&ns(ns_), seed, n, |i| {
        vec![(seed as usize + i) as u8; BLOCK]
    })
}

fn mem(shares: Shares) -> MemoryTier {
    MemoryTier::with_shares(TIER, Arc::new(shares))
}

fn put_all(t: &MemoryTier, blocks: &[Block]) {
    for b in blocks {
        // A chain longer than the writer's share fails in memory (the
        // engine then keeps it on disk); the flood goes on regardless.
        let _ = t.put_block(b.clone(), Overwrite::Never);
    }
}

/// How many leading blocks of `chain` are resident (what a lookup reports).
fn prefix_hits(t: &MemoryTier, chain: &[Block]) -> usize {
    chain
        .iter()
        .take_while(|b| t.contains_block(&b.meta.id))
        .count()
}

/// `noisy` writes ten tiers' worth of 4-block chains into `ns_`.
fn flood(t: &MemoryTier, ns_: &str) {
    for seed in 0..80 {
        put_all(t, &chain(ns_, 1000 + seed, 4));
    }
}

fn bytes_of(t: &MemoryTier, name: &str) -> u64 {
    t.share_stats()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap()
        .bytes
}

#[test]
fn a_noisy_namespace_cannot_push_a_quiet_one_below_its_share() {
    let t = mem(Shares::default());
    let quiet = chain("quiet", 1, 12);
    put_all(&t, &quiet);
    flood(&t, "noisy");
    assert_eq!(prefix_hits(&t, &quiet), 12);
    t.check_invariants().unwrap();
    // The noisy tenant paid with its own blocks, and the counters say so.
    let other = &t.share_stats()[0];
    assert_eq!(other.name, "other");
    assert!(other.evicted_by_own > 200, "{other:?}");
}

#[test]
fn without_shares_the_same_flood_empties_the_quiet_namespace() {
    let t = mem(Shares::off());
    let quiet = chain("quiet", 1, 12);
    put_all(&t, &quiet);
    flood(&t, "noisy");
    assert_eq!(prefix_hits(&t, &quiet), 0);
}

#[test]
fn a_tenant_over_its_share_is_trimmed_to_it_tail_first() {
    let t = mem(Shares::default());
    let quiet = chain("quiet", 1, 28);
    put_all(&t, &quiet);
    assert_eq!(prefix_hits(&t, &quiet), 28);
    flood(&t, "noisy");
    // Half of 32 blocks each, and what is left of quiet is its prefix.
    let hits = prefix_hits(&t, &quiet);
    assert!((15..=16).contains(&hits), "{hits}");
    assert!(quiet[hits..].iter().all(|b| !t.contains_block(&b.meta.id)));
    t.check_invariants().unwrap();
}

#[test]
fn a_tenant_alone_may_fill_the_tier() {
    let t = mem(Shares::default());
    // Namespaces under one prefix are one tenant, and it is alone.
    for seed in 0..10 {
        put_all(&t, &chain(&format!("acme/{seed}"), seed, 4));
    }
    let s = t.stats_snapshot();
    assert!(s.bytes > TIER - (BLOCK as u64 + 1024), "{s:?}");
    assert_eq!(s.blocks, 32);
}

#[test]
fn many_namespaces_under_one_prefix_are_one_tenant() {
    let t = mem(Shares::default());
    let quiet = chain("acme/llama", 1, 12);
    put_all(&t, &quiet);
    for seed in 0..80 {
        put_all(&t, &chain(&format!("mallory/{seed}"), 1000 + seed, 4));
    }
    assert_eq!(prefix_hits(&t, &quiet), 12);
}

#[test]
fn configured_weights_divide_a_full_tier() {
    let shares = Shares {
        classes: vec![
            ShareClass {
                name: "gold".into(),
                prefix: "gold-".into(),
                weight: 3,
            },
            ShareClass {
                name: "tin".into(),
                prefix: "tin-".into(),
                weight: 1,
            },
        ],
        ..Shares::default()
    };
    let t = mem(shares);
    for seed in 0..80 {
        put_all(&t, &chain("gold-a", 1000 + seed, 4));
        put_all(&t, &chain("tin-a", 5000 + seed, 4));
    }
    let (gold, tin) = (bytes_of(&t, "gold"), bytes_of(&t, "tin"));
    let unit = BLOCK as u64;
    // 24 and 8 of 32 blocks, within one block.
    assert!(gold.abs_diff(24 * unit) < 2 * unit, "gold {gold}");
    assert!(tin.abs_diff(8 * unit) < 2 * unit, "tin {tin}");
    assert_eq!(bytes_of(&t, "other"), 0);
}

#[test]
fn a_chain_longer_than_the_writers_share_fails_instead_of_evicting_others() {
    let t = mem(Shares::default());
    let quiet = chain("quiet", 1, 12);
    put_all(&t, &quiet);
    let long = chain("noisy", 2, 40);
    let errs: Vec<String> = long
        .iter()
        .filter_map(|b| t.put_block(b.clone(), Overwrite::Never).err())
        .map(|e| e.to_string())
        .collect();
    assert_eq!(prefix_hits(&t, &quiet), 12);
    assert!(!errs.is_empty());
    assert!(errs[0].contains("capacity share"), "{}", errs[0]);
    t.check_invariants().unwrap();
}

async fn disk_flood(shares: Shares) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let size = BLOCK;
    let c = DiskConfig {
        shares,
        ..cfg(dir.path(), 32 * cost(size), SyncMode::Never)
    };
    let (tier, _) = DiskTier::open(c).unwrap();
    let quiet = chain_blocks(&ns("quiet"), 1, 12, size);
    for b in &quiet {
        tier.put(b.clone()).await.unwrap();
    }
    for seed in 0..80 {
        for b in chain_blocks(&ns("noisy"), 1000 + seed, 4, size) {
            let _ = tier.put(b).await;
        }
    }
    tier.check_invariants().unwrap();
    let hits = quiet.iter().take_while(|b| tier.has(&b.meta.id)).count();
    if tier.config().shares.fair {
        let s = tier.share_stats();
        assert!(s[0].evicted_by_own > 200, "{s:?}");
    }
    hits
}

#[tokio::test]
async fn the_disk_tier_keeps_a_quiet_namespace_share_too() {
    assert_eq!(disk_flood(Shares::default()).await, 12);
    assert_eq!(disk_flood(Shares::off()).await, 0);
}
