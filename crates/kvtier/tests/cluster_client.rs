//! The Rust `ClusterClient` (kvtier_client::cluster) against real servers.
//!
//! * Three independent servers (not a cluster), which makes the client's own
//!   placement visible: a block is on the node the client sent it to and
//!   nowhere else. Each block lands on its first owner; a block one node
//!   lacks is asked of its next owner, up to `replicas`; a read ends at the
//!   first block no owner has; a stopped node's blocks go to their next
//!   owner; an error that is an answer is not failed over.
//! * A real 3-node cluster (R = 2, Azurite as the object store): a client
//!   holding the node list and one holding a single address get the same
//!   lookups and byte-identical reads; with the node list every write goes to
//!   an owner (each owner forwards one copy, a non-owner's memory tier gains
//!   nothing) and every read is served from the first owner's memory; a node
//!   killed in the middle of a load fails nothing through the node list.
mod common;

use common::cluster::{Node, chain, held_in, keys, nodes};
use common::{ready, serve_command};
use kvtier_client::{Client, ClientConfig, ClusterClient, ClusterConfig, Tier, WriteBlock};
use kvtier_core::Key;
use kvtier_core::cluster::rank;
use kvtier_object::testing::Emulator;
use std::process::Child;
use std::time::Duration;

const NS: &str = "tenant-a/model";

fn cluster_config(names: &[String]) -> ClusterConfig {
    let mut c = ClusterConfig::new(
        &names
            .iter()
            .map(|n| format!("grpc://{n}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    c.client.timeout = Duration::from_secs(10);
    c.client.connections = 2;
    c
}

/// The node names ranked for `k`, best first.
fn ranked(names: &[String], k: &Key) -> Vec<String> {
    rank(names, NS, k.as_bytes())
        .into_iter()
        .map(String::from)
        .collect()
}

/// Which of `singles` (by name) hold `k`, each asked on its own.
async fn holders(singles: &[(String, Client)], k: &Key) -> Vec<String> {
    let mut out = Vec::new();
    for (n, c) in singles {
        if c.lookup(NS, std::slice::from_ref(k), None)
            .await
            .unwrap()
            .found
            == 1
        {
            out.push(n.clone());
        }
    }
    out
}

fn assert_read(got: &kvtier_client::ReadResult, want: &[&WriteBlock], who: &str) {
    assert_eq!(got.blocks.len(), want.len(), "{who}: {} blocks", want.len());
    for (i, (g, w)) in got.blocks.iter().zip(want).enumerate() {
        assert_eq!(g.index, i, "{who}: index in the caller's order");
        assert_eq!(g.key, w.key, "{who}: key {i}");
        assert_eq!(g.payload, w.payload, "{who}: payload {i} byte-identical");
        assert_eq!(g.parent, w.parent, "{who}: parent {i}");
    }
}

struct Standalone(Child);

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_places_blocks_itself_and_fails_over() {
    let mut procs = Vec::new();
    let mut names = Vec::new();
    for _ in 0..3 {
        let mut child = serve_command()
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("spawn kvtier serve");
        let r = ready(&mut child).expect("ready json");
        names.push(r["grpc"][0].as_str().unwrap().to_string());
        procs.push(Standalone(child));
    }
    let mut singles = Vec::new();
    for n in &names {
        let mut cc = ClientConfig::new(format!("http://{n}"));
        cc.retries = 0;
        singles.push((n.clone(), Client::connect(cc).await.unwrap()));
    }
    let cc = ClusterClient::connect(cluster_config(&names))
        .await
        .unwrap();
    assert_eq!(cc.nodes(), names.as_slice());

    // Each block lands on its first owner, and only there.
    let blocks = chain(1, 60);
    let w = cc.write(NS, &blocks).await.unwrap();
    assert_eq!((w.stored, w.existing), (60, 0));
    let mut firsts = std::collections::BTreeSet::new();
    for b in &blocks {
        let first = ranked(&names, &b.key)[0].clone();
        assert_eq!(holders(&singles, &b.key).await, vec![first.clone()]);
        assert_eq!(cc.owners(NS, &b.key)[0], first);
        firsts.insert(first);
    }
    assert_eq!(firsts.len(), 3, "60 blocks spread over every node");
    let all: Vec<&WriteBlock> = blocks.iter().collect();
    assert_read(&cc.read(NS, &keys(&blocks), 0).await.unwrap(), &all, "read");
    let s = cc.stats().await.unwrap();
    let mem = s.tiers.iter().find(|t| t.tier == Tier::Memory as i32);
    assert_eq!(mem.unwrap().blocks, 60, "stats summed over the nodes");

    // The lookup goes to the first owner of the first key.
    let first = &ranked(&names, &blocks[0].key)[0];
    let i = names.iter().position(|n| n == first).unwrap();
    let want = singles[i].1.lookup(NS, &keys(&blocks), None).await.unwrap();
    let got = cc.lookup(NS, &keys(&blocks), None).await.unwrap();
    assert!(got.found >= 1);
    assert_eq!(got.found, want.found);

    // A block only its second owner has is found there; one only its third
    // node has is not (two owners answered without it); a read ends at the
    // first block no owner has.
    let extra = chain(2, 2);
    let second = ranked(&names, &extra[0].key)[1].clone();
    let third = ranked(&names, &extra[1].key)[2].clone();
    let by_name = |n: &str| &singles.iter().find(|s| s.0 == n).unwrap().1;
    by_name(&second)
        .write(NS, std::slice::from_ref(&extra[0]))
        .await
        .unwrap();
    by_name(&third)
        .write(NS, std::slice::from_ref(&extra[1]))
        .await
        .unwrap();
    let ks = [
        blocks[0].key.clone(),
        extra[0].key.clone(),
        blocks[1].key.clone(),
    ];
    let r = cc.read(NS, &ks, 0).await.unwrap();
    assert_read(&r, &[&blocks[0], &extra[0], &blocks[1]], "next owner");
    assert!(!r.partial);
    let ks = [
        blocks[0].key.clone(),
        blocks[1].key.clone(),
        extra[1].key.clone(),
        blocks[2].key.clone(),
    ];
    let r = cc.read(NS, &ks, 0).await.unwrap();
    assert_read(&r, &[&blocks[0], &blocks[1]], "cut");
    assert!(r.partial);
    assert_eq!(r.reason, "missing");

    // An error that is an answer is returned, not failed over.
    let e = cc.write("bad ns!", &blocks[..3]).await.unwrap_err();
    assert!(!kvtier_client::cluster::unreachable(&e), "{e}");
    assert!(cc.down().is_empty());

    // A stopped node: skipped, its blocks go to their next owner.
    let gone = names[1].clone();
    drop(procs.remove(1));
    let later = chain(3, 30);
    let w = cc.write(NS, &later).await.unwrap();
    assert_eq!(w.stored, 30);
    assert_eq!(cc.down(), vec![gone.clone()]);
    let live: Vec<(String, Client)> = singles.into_iter().filter(|s| s.0 != gone).collect();
    let mut moved = 0;
    for b in &later {
        let r = ranked(&names, &b.key);
        let want = if r[0] == gone {
            r[1].clone()
        } else {
            r[0].clone()
        };
        moved += usize::from(r[0] == gone);
        assert_eq!(holders(&live, &b.key).await, [want]);
        assert_eq!(
            cc.owners(NS, &b.key)[0],
            r.iter().find(|n| **n != gone).unwrap().clone()
        );
    }
    assert!(moved > 0, "some of 30 blocks were the stopped node's");
    let all: Vec<&WriteBlock> = later.iter().collect();
    assert_read(
        &cc.read(NS, &keys(&later), 0).await.unwrap(),
        &all,
        "after stop",
    );
    assert!(cc.stats().await.is_ok(), "stats of the nodes that answer");
}

/// Sum over `nodes` of the calls they forwarded to other nodes (`op`).
fn forwarded(nodes: &[Node], op: &str) -> u64 {
    nodes.iter().map(|n| n.forwarded(op)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_list_and_one_address_agree_and_writes_go_to_owners() {
    let em = Emulator::azurite().expect("Azurite");
    em.create_container("kvtier").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut ns = nodes(tmp.path(), 3);
    let names: Vec<String> = ns.iter().map(Node::name).collect();
    for n in &mut ns {
        n.start(&em, &names);
    }
    let cc = ClusterClient::connect(cluster_config(&names))
        .await
        .unwrap();
    let singles = [
        ns[0].client().await,
        ns[1].client().await,
        ns[2].client().await,
    ];

    // Chains 0..6 through the node list, 6..12 through node 0 alone.
    let listed: Vec<Vec<WriteBlock>> = (0..6).map(|c| chain(c, 10)).collect();
    let single: Vec<Vec<WriteBlock>> = (6..12).map(|c| chain(c, 10)).collect();
    let owners = |k: &Key| ranked(&names, k)[..2].to_vec();
    for ch in &listed {
        cc.write(NS, ch).await.unwrap();
    }
    // Each block went to an owner, which forwarded one copy to the other:
    // one forwarded put per block (a non-owner forwards two).
    assert_eq!(forwarded(&ns, "put"), 60, "one forwarded put per block");
    let want: Vec<u64> = names
        .iter()
        .map(|n| {
            listed
                .iter()
                .flatten()
                .filter(|b| owners(&b.key).contains(n))
                .count() as u64
        })
        .collect();
    let mut in_memory = Vec::new();
    for c in &singles {
        in_memory.push(held_in(c, Tier::Memory).await);
    }
    assert_eq!(
        in_memory, want,
        "each owner's memory gains its blocks, a non-owner's none"
    );
    assert_eq!(in_memory.iter().sum::<u64>(), 120);
    for ch in &single {
        singles[0].write(NS, ch).await.unwrap();
    }
    let through_0: u64 = single
        .iter()
        .flatten()
        .map(|b| {
            if owners(&b.key).contains(&names[0]) {
                1
            } else {
                2
            }
        })
        .sum();
    assert!(through_0 > 60, "node 0 is not every block's owner");
    assert_eq!(
        forwarded(&ns, "put"),
        60 + through_0,
        "through a non-owner: two"
    );

    // Identical answers, byte-identical blocks, whichever client reads.
    let gets = forwarded(&ns, "get");
    for ch in listed.iter().chain(&single) {
        let want: Vec<&WriteBlock> = ch.iter().collect();
        let r = cc.read(NS, &keys(ch), 0).await.unwrap();
        assert_read(&r, &want, "node list");
        assert!(
            r.blocks.iter().all(|b| b.tier == Tier::Memory),
            "every block from its first owner's memory: {:?}",
            r.blocks.iter().map(|b| b.tier).collect::<Vec<_>>()
        );
    }
    assert_eq!(
        forwarded(&ns, "get"),
        gets,
        "the node list's reads asked no peer"
    );
    for ch in listed.iter().chain(&single) {
        let want: Vec<&WriteBlock> = ch.iter().collect();
        for (i, c) in singles.iter().enumerate() {
            let r = c.read(NS, &keys(ch), 0).await.unwrap();
            assert_read(&r, &want, &format!("node {i}"));
        }
    }
    assert!(
        forwarded(&ns, "get") > gets,
        "one address: non-owners ask peers"
    );
    let mut probes: Vec<Vec<Key>> = listed.iter().chain(&single).map(|c| keys(c)).collect();
    // A chain with an unknown block in the middle, and one that starts unknown.
    let unknown = Key::new(bytes::Bytes::from_static(b"never-written")).unwrap();
    let mut gap = keys(&listed[0]);
    gap.insert(4, unknown.clone());
    probes.push(gap);
    probes.push(vec![unknown.clone(), listed[1][0].key.clone()]);
    for ks in &probes {
        let a = cc.lookup(NS, ks, None).await.unwrap();
        let r = cc.read(NS, ks, 0).await.unwrap();
        for (i, c) in singles.iter().enumerate() {
            let b = c.lookup(NS, ks, None).await.unwrap();
            assert_eq!(a.found, b.found, "lookup through node {i}");
            let s = c.read(NS, ks, 0).await.unwrap();
            assert_eq!(r.blocks.len(), s.blocks.len(), "read through node {i}");
            assert_eq!((r.partial, &r.reason), (s.partial, &s.reason));
            for (x, y) in r.blocks.iter().zip(&s.blocks) {
                assert_eq!(
                    (&x.key, &x.payload, &x.parent),
                    (&y.key, &y.payload, &y.parent)
                );
            }
        }
    }

    // Node 1 killed in the middle of a load through the node list: nothing fails.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = {
        let (cc, done, old) = (cc.clone(), done.clone(), listed.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut errors = Vec::new();
            for i in 0..40u32 {
                let ch = chain(100 + i, 4);
                match cc.write(NS, &ch).await {
                    Ok(_) => acked.push(ch),
                    Err(e) => errors.push(format!("write: {e}")),
                }
                let old = &old[i as usize % old.len()];
                match cc.read(NS, &keys(old), 0).await {
                    Ok(r) if r.blocks.len() == old.len() => {}
                    Ok(r) => errors.push(format!("read returned {} of 10", r.blocks.len())),
                    Err(e) => errors.push(format!("read: {e}")),
                }
                match cc.lookup(NS, &keys(old), None).await {
                    Ok(l) if l.found == old.len() => {}
                    Ok(l) => errors.push(format!("lookup found {} of 10", l.found)),
                    Err(e) => errors.push(format!("lookup: {e}")),
                }
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            (acked, errors)
        })
    };
    while done.load(std::sync::atomic::Ordering::SeqCst) < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ns[1].kill();
    let at_kill = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        at_kill < 35,
        "killed during the load ({at_kill} of 40 done)"
    );
    let (acked, errors) = load.await.unwrap();
    assert!(
        errors.is_empty(),
        "no call failed while node 1 died: {errors:?}"
    );
    assert_eq!(acked.len(), 40);
    let per_node = cc.node_stats().await;
    assert!(per_node[1].1.is_err() && per_node[0].1.is_ok() && per_node[2].1.is_ok());
    assert_eq!(cc.down(), [names[1].clone()]);
    for ch in listed.iter().chain(&single).chain(&acked) {
        let want: Vec<&WriteBlock> = ch.iter().collect();
        assert_read(
            &cc.read(NS, &keys(ch), 0).await.unwrap(),
            &want,
            "node list, node 1 down",
        );
        for i in [0, 2] {
            let r = singles[i].read(NS, &keys(ch), 0).await.unwrap();
            assert_read(&r, &want, &format!("node {i}, node 1 down"));
        }
    }
}
