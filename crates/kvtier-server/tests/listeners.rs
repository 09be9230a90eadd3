//! Several listeners, each on its own pinned runtime, sharing one store.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig};

#[tokio::test]
async fn pinned_listeners_share_one_store() {
    let cpus = kvtier_server::numa::current_affinity().unwrap();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let mut cfg = common::test_config();
    cfg.server.listen = vec![
        format!("127.0.0.1:0@{a}"),
        format!("127.0.0.1:0@{b}"),
        "127.0.0.1:0".into(),
    ];
    let server = kvtier_server::Server::start(cfg).await.unwrap();
    assert_eq!(server.grpc_addrs.len(), 3);
    let clients: Vec<Client> =
        futures::future::join_all(server.grpc_addrs.iter().map(|addr| async move {
            Client::connect(ClientConfig::new(format!("http://{addr}")))
                .await
                .unwrap()
        }))
        .await;
    let tokens: Vec<u32> = (0..256).collect();
    clients[0]
        .write_tokens(
            "numa",
            &tokens,
            &[Bytes::from_static(b"one"), Bytes::from_static(b"two")],
        )
        .await
        .unwrap();
    for c in &clients[1..] {
        let l = c.lookup_tokens("numa", &tokens, None).await.unwrap();
        assert_eq!(l.found, 2);
        let r = c.read("numa", &l.keys, 0).await.unwrap();
        assert_eq!(r.blocks[1].payload, Bytes::from_static(b"two"));
    }
    server.shutdown().await.unwrap();
}

#[test]
fn numa_flag_expands_listeners_per_node() {
    let mut cfg = kvtier_server::config::Config::default();
    cfg.server.listen = vec!["127.0.0.1:18085".into()];
    cfg.server.numa = true;
    let l = cfg.listeners().unwrap();
    assert_eq!(l.len(), kvtier_server::numa::nodes().len());
    assert_eq!(l[0].addr.port(), 18085);
    assert!(l[0].cpus.as_ref().is_some_and(|c| !c.is_empty()));
}
