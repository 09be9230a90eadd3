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

/// `server.max_streams_per_connection` is enforced per HTTP/2 connection
/// (SETTINGS_MAX_CONCURRENT_STREAMS): with 1, a second call on the same
/// connection while a client-streaming WriteStream is open is not served
/// (the server resets it with REFUSED_STREAM, which gRPC clients may retry;
/// a client that honours the setting waits instead); once the stream ends,
/// calls go through again.
#[tokio::test]
async fn a_connection_carries_at_most_max_streams_per_connection_calls() {
    use kvtier_proto::v1 as pb;
    use kvtier_proto::v1::kv_tier_client::KvTierClient;
    use std::time::Duration;
    let mut cfg = common::test_config();
    cfg.server.max_streams_per_connection = 1;
    let (server, _c) = common::start(cfg).await;
    let channel = tonic::transport::Endpoint::from_shared(common::raw_endpoint(&server))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut first = KvTierClient::new(channel.clone());
    let second = KvTierClient::new(channel);
    // Stream 1: a WriteStream whose request stream stays open.
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::WriteRequest>(1);
    let open = tokio::spawn(async move {
        first
            .write_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    // The second send returns once the first message was taken for the
    // request body: stream 1's HEADERS are then on the connection, ahead of
    // anything sent after.
    for _ in 0..2 {
        tx.send(pb::WriteRequest {
            namespace: "s".into(),
            blocks: vec![],
        })
        .await
        .unwrap();
    }
    let stats = || {
        let mut c = second.clone();
        async move { c.stats(pb::StatsRequest {}).await }
    };
    // Stream 2 is refused, or waits for a free stream; it is not served.
    match tokio::time::timeout(Duration::from_millis(500), stats()).await {
        Err(_) => {} // waiting
        Ok(Err(s)) => assert!(
            s.code() == tonic::Code::Unavailable && format!("{s:?}").contains("REFUSED_STREAM"),
            "{s:?}"
        ),
        Ok(Ok(_)) => panic!("a second stream was served beside the open one"),
    }
    // Once stream 1 ends, a call goes through.
    drop(tx);
    open.await.unwrap().expect("the WriteStream ends cleanly");
    tokio::time::timeout(Duration::from_secs(10), stats())
        .await
        .expect("served once the stream was free")
        .expect("stats");
}
