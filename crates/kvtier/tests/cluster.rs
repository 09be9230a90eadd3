//! Cluster mode end to end (docs/cluster.md): three `kvtier serve` processes
//! on loopback, R=2, sharing one Azurite container started by the test.
//! Blocks written through one node are read byte-identical through every
//! node, and live on their two owners only; a node killed with SIGKILL during
//! a load loses no acknowledged block and fails no read; restarted, it
//! serves its blocks from its disk again; a fourth node takes about a
//! quarter of the placements and nothing is lost.
mod common;

use common::cluster::{Node, chain, held, held_in, keys, nodes};
use kvtier_client::{Client, Tier, WriteBlock};
use kvtier_core::Key;
use kvtier_core::cluster::rank;
use kvtier_object::testing::Emulator;
use std::time::{Duration, Instant};

const NS: &str = "tenant-a/model";

async fn read_all(c: &Client, chains: &[Vec<WriteBlock>], who: &str) {
    for ch in chains {
        let r = c.read(NS, &keys(ch), 0).await.unwrap();
        assert_eq!(r.blocks.len(), ch.len(), "{who}: every block of the chain");
        for (got, want) in r.blocks.iter().zip(ch) {
            assert_eq!(got.payload, want.payload, "{who}: byte-identical");
            assert_eq!(got.parent, want.parent);
        }
        assert_eq!(
            c.lookup(NS, &keys(ch), None).await.unwrap().found,
            ch.len(),
            "{who}: lookup"
        );
    }
}

/// The node names owning `k` with `members` (rank order, R = 2).
fn owners(members: &[String], k: &Key) -> Vec<String> {
    rank(members, NS, k.as_bytes())[..2]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_act_as_one_cache_through_kills_restarts_and_growth() {
    let em = Emulator::azurite().expect("Azurite");
    em.create_container("kvtier").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut ns = nodes(tmp.path(), 4);
    let three: Vec<String> = ns[..3].iter().map(Node::name).collect();
    for n in &mut ns[..3] {
        n.start(&em, &three);
    }
    let clients = [
        ns[0].client().await,
        ns[1].client().await,
        ns[2].client().await,
    ];

    // 200 blocks (10 chains of 20) written through node 0.
    let chains: Vec<Vec<WriteBlock>> = (0..10).map(|c| chain(c, 20)).collect();
    for ch in &chains {
        clients[0].write(NS, ch).await.unwrap();
    }
    for (i, c) in clients.iter().enumerate() {
        read_all(c, &chains, &format!("node {i}")).await;
    }
    // Each block lives on exactly its two owners: reads through a
    // non-owner did not leave copies behind.
    let mut per_node = Vec::new();
    for c in &clients {
        per_node.push(held(c).await);
    }
    let want: Vec<u64> = three
        .iter()
        .map(|n| {
            chains
                .iter()
                .flatten()
                .filter(|b| owners(&three, &b.key).contains(n))
                .count() as u64
        })
        .collect();
    assert_eq!(per_node, want, "each node holds exactly the blocks it owns");
    let mut in_memory = Vec::new();
    for c in &clients {
        in_memory.push(held_in(c, Tier::Memory).await);
    }
    assert_eq!(
        in_memory, want,
        "not even in memory: a non-owner keeps no copy"
    );
    assert_eq!(per_node.iter().sum::<u64>(), 400);
    for h in &per_node {
        assert!(
            (110..=157).contains(h),
            "about 2/3 of 200 each: {per_node:?}"
        );
    }

    // SIGKILL node 1 in the middle of a read/write load through nodes 0 and 2.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = {
        let (c0, c2) = (clients[0].clone(), clients[2].clone());
        let done = done.clone();
        let old = chains.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut lat = Vec::new();
            let mut errors = Vec::new();
            for i in 0..60u32 {
                let c = if i % 2 == 0 { &c0 } else { &c2 };
                let ch = chain(100 + i, 4);
                let t0 = Instant::now();
                match c.write(NS, &ch).await {
                    Ok(_) => acked.push(ch),
                    Err(e) => errors.push(format!("write: {e}")),
                }
                let r = c.read(NS, &keys(&old[i as usize % old.len()]), 0).await;
                match r {
                    Ok(r) if r.blocks.len() == 20 => {}
                    Ok(r) => errors.push(format!("read returned {} of 20", r.blocks.len())),
                    Err(e) => errors.push(format!("read: {e}")),
                }
                lat.push(t0.elapsed());
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            (acked, lat, errors)
        })
    };
    // Kill once the load is under way (the disk tier of node 1 has grown).
    let t0 = Instant::now();
    while held(&clients[1]).await <= per_node[1] && t0.elapsed() < Duration::from_secs(30) {
        tokio::task::yield_now().await;
    }
    let before_kill = held(&clients[1]).await;
    ns[1].kill();
    let at_kill = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        at_kill < 50,
        "killed during the load, not after ({at_kill} of 60 done)"
    );
    let (acked, mut lat, errors) = load.await.unwrap();
    assert!(
        errors.is_empty(),
        "no request failed while node 1 died: {errors:?}"
    );
    lat.sort();
    let p99 = lat[lat.len() * 99 / 100 - 1];
    eprintln!(
        "failover load: {} write+read pairs, 0 errors, median {:?}, p99 {:?}, max {:?}",
        lat.len(),
        lat[lat.len() / 2],
        p99,
        lat.last().unwrap()
    );
    assert!(
        *lat.last().unwrap() < Duration::from_secs(10),
        "within the deadline"
    );
    // Nothing acknowledged is lost: every write readable through the survivors.
    for c in [&clients[0], &clients[2]] {
        read_all(c, &acked, "survivor").await;
    }

    // Restarted, node 1 serves its blocks from its own disk.
    ns[1].start(&em, &three);
    let c1 = ns[1].client().await;
    assert!(held(&c1).await >= before_kill, "recovered its disk");
    let mine: Vec<&WriteBlock> = chains
        .iter()
        .flatten()
        .filter(|b| owners(&three, &b.key).contains(&ns[1].name()))
        .collect();
    for b in mine.iter().take(20) {
        let r = c1.read(NS, std::slice::from_ref(&b.key), 0).await.unwrap();
        assert_eq!(r.blocks.len(), 1);
        assert!(
            matches!(r.blocks[0].tier, Tier::Disk | Tier::Memory),
            "served from its own tiers, not {:?}",
            r.blocks[0].tier
        );
        assert_eq!(r.blocks[0].payload, b.payload);
    }

    // A fourth node: about a quarter of the placements move to it, and
    // nothing is lost through any node (blocks it should own but never got
    // come from the old owners' copy in the object store).
    let four: Vec<String> = ns.iter().map(Node::name).collect();
    let all: Vec<&WriteBlock> = chains
        .iter()
        .flatten()
        .chain(acked.iter().flatten())
        .collect();
    let moved = all
        .iter()
        .filter(|b| rank(&three, NS, b.key.as_bytes())[0] != rank(&four, NS, b.key.as_bytes())[0])
        .count() as f64
        / all.len() as f64;
    assert!(
        (0.12..=0.40).contains(&moved),
        "{moved} of first placements moved"
    );
    ns[3].start(&em, &four);
    for n in &mut ns[..3] {
        n.kill();
        n.start(&em, &four);
    }
    let mut everyone = Vec::new();
    for n in &ns {
        everyone.push(n.client().await);
    }
    let acked_chains: Vec<Vec<WriteBlock>> = chains.iter().cloned().chain(acked).collect();
    for (i, c) in everyone.iter().enumerate() {
        read_all(c, &acked_chains, &format!("node {i} of 4")).await;
    }
}
