//! Cluster mode in process (docs/cluster.md): three memory-only nodes on
//! loopback. The HTTP key/value API acts as one store whichever node a
//! request lands on; DNS membership names nodes by what they report, not by
//! their address; the cluster metrics count forwarded calls and failovers.
//! (Processes, an object store, SIGKILL and restarts: crates/kvtier/tests/cluster.rs.)
mod common;

use kvtier_object::testing::free_ports;
use kvtier_server::Server;
use kvtier_server::cluster::{ClusterSection, GrpcPeers};
use std::time::Duration;

/// Three nodes named `host:port` by `names` (the names may differ from
/// the 127.0.0.1 addresses they listen on, as pod DNS names do).
async fn cluster(host: &str, replicas: usize) -> (Vec<Server>, Vec<String>, Vec<u16>) {
    let ports = free_ports(3);
    let names: Vec<String> = ports.iter().map(|p| format!("{host}:{p}")).collect();
    let mut servers = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let mut cfg = common::test_config();
        cfg.server.listen = vec![format!("127.0.0.1:{p}")];
        cfg.server.data_listen = String::new();
        cfg.cluster = ClusterSection {
            nodes: names.iter().map(|n| format!("grpc://{n}")).collect(),
            self_: format!("grpc://{}", names[i]),
            replicas,
            peer_timeout: Duration::from_secs(1),
            down_for: Duration::from_secs(30),
            ..Default::default()
        };
        servers.push(Server::start(cfg).await.expect("node starts"));
    }
    (servers, names, ports)
}

fn http(s: &Server) -> String {
    format!("http://{}", s.http_addr.unwrap())
}

async fn metric(s: &Server, prefix: &str) -> f64 {
    let body = reqwest::get(format!("{}/metrics", http(s)))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_kv_is_one_store_whichever_node_answers() {
    // R=1: most keys live on one node only, so most requests are forwarded.
    let (servers, _, _) = cluster("127.0.0.1", 1).await;
    let c = reqwest::Client::new();
    for i in 0..12 {
        let via = &servers[i % 3];
        let url = |s: &Server| format!("{}/v1/kv/app/key-{i}", http(s));
        assert_eq!(
            c.put(url(via))
                .body(format!("v1-{i}"))
                .send()
                .await
                .unwrap()
                .status(),
            204
        );
        for s in &servers {
            let r = c.get(url(s)).send().await.unwrap();
            assert_eq!(r.status(), 200, "key-{i} through every node");
            assert_eq!(r.text().await.unwrap(), format!("v1-{i}"));
        }
        // A put through another node replaces the value everywhere.
        let other = &servers[(i + 1) % 3];
        c.put(url(other))
            .body(format!("v2-{i}"))
            .send()
            .await
            .unwrap();
        for s in &servers {
            assert_eq!(
                c.get(url(s)).send().await.unwrap().text().await.unwrap(),
                format!("v2-{i}")
            );
        }
        // And a delete through a third is seen by all.
        let third = &servers[(i + 2) % 3];
        assert_eq!(c.delete(url(third)).send().await.unwrap().status(), 204);
        for s in &servers {
            assert_eq!(
                c.get(url(s)).send().await.unwrap().status(),
                404,
                "key-{i} deleted everywhere"
            );
        }
    }
    let forwarded: f64 = {
        let mut n = 0.0;
        for s in &servers {
            n += metric(s, "kvtier_cluster_forwarded_requests_total{").await;
        }
        n
    };
    assert!(
        forwarded >= 12.0,
        "forwarded calls are counted: {forwarded}"
    );
    for s in servers {
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peer_is_counted_and_skipped() {
    let (mut servers, _, _) = cluster("127.0.0.1", 1).await;
    let c = reqwest::Client::new();
    let dead = servers.pop().unwrap();
    dead.shutdown().await.unwrap();
    // Keys owned by the dead node: the first call to it fails (counted, and
    // the node is skipped from then on) and the next node of the ranking
    // takes the write within the same request; reads through a node that has
    // not noticed yet fail over the same way.
    let mut ok = 0;
    for i in 0..20 {
        let r = c
            .put(format!("{}/v1/kv/app/k{i}", http(&servers[0])))
            .body("x")
            .send()
            .await
            .unwrap();
        if r.status() == 204 {
            ok += 1;
            let r = c
                .get(format!("{}/v1/kv/app/k{i}", http(&servers[1])))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        } else {
            assert_eq!(
                r.status(),
                503,
                "an unreachable owner is UNAVAILABLE, not a hang"
            );
        }
    }
    assert_eq!(ok, 20, "no write fails for a dead owner");
    assert!(metric(&servers[0], "kvtier_cluster_failovers_total{").await >= 1.0);
    for s in servers {
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_membership_uses_the_names_nodes_report() {
    // The nodes call themselves localhost:PORT; DNS would hand out 127.0.0.1:PORT.
    let (servers, names, ports) = cluster("localhost", 2).await;
    let cfg = ClusterSection {
        dns: "localhost:1".into(),
        self_: format!("grpc://{}", names[0]),
        peer_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let peers = GrpcPeers::new(&cfg, 64 << 20, None).unwrap();
    let mut addrs: Vec<std::net::SocketAddr> = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
        .collect();
    // An address nobody answers on is not a member (not ready yet).
    addrs.push(format!("127.0.0.1:{}", free_ports(1)[0]).parse().unwrap());
    peers.learn(addrs.clone()).await.unwrap();
    let mut want = names.clone();
    want.sort();
    assert_eq!(peers.members(), want);
    // A member that misses a round (here: stopped) keeps its place for a
    // while: one slow Stats must not move every placement.
    let mut servers = servers;
    servers.pop().unwrap().shutdown().await.unwrap();
    peers.learn(addrs.clone()).await.unwrap();
    assert_eq!(peers.members(), want);
    // An address gone from DNS is gone from the membership at once.
    peers.learn(addrs[..2].to_vec()).await.unwrap();
    let mut two = names[..2].to_vec();
    two.sort();
    assert_eq!(peers.members(), two);
    for s in servers {
        s.shutdown().await.unwrap();
    }
}
