//! gRPC requests that waited in their socket (`grpc::late`): the wait counts
//! as queue time, and past what the adaptive limit allows the request is
//! shed before it is decoded (docs/operations.md, "Late requests").
mod common;

use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use std::sync::mpsc;
use std::time::Duration;

/// A Lookup of key `k` in namespace `q`.
fn lookup_k() -> pb::LookupRequest {
    pb::LookupRequest {
        namespace: "q".into(),
        keys: vec![b"k".to_vec().into()],
        ..Default::default()
    }
}

/// A Lookup, retried while shed (on a loaded machine a warm-up request may
/// itself wait past the adaptive bound): only the late request under test
/// must see UNAVAILABLE.
async fn lookup_served(c: &mut KvTierClient<tonic::transport::Channel>) -> pb::LookupResponse {
    for _ in 0..50 {
        match c.lookup(lookup_k()).await {
            Ok(r) => return r.into_inner(),
            Err(e) if e.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("lookup: {e:?}"),
        }
    }
    panic!("lookup shed 50 times in a row")
}

/// How long the server's runtime is blocked while the late request waits.
const BUSY: Duration = Duration::from_millis(600);

/// A Lookup sent by a client on its own thread while this (current-thread)
/// runtime, the server's, is blocked for [`BUSY`]: the request waits in the
/// server's socket for most of it (the client thread sends it just after
/// the block starts).
async fn lookup_while_busy(url: String) -> Result<pb::LookupResponse, tonic::Status> {
    assert!(
        kvtier_server::rx_stamp::kernel_stamps_on(Duration::from_secs(10)).await,
        "the kernel never stamped a received packet (SO_TIMESTAMPING)"
    );
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut c = KvTierClient::connect(url).await.unwrap();
            // The connection is up (and quiet) before the server gets busy.
            lookup_served(&mut c).await;
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            let r = c.lookup(lookup_k()).await.map(|r| r.into_inner());
            done_tx.send(r).unwrap();
        });
    });
    let ready = tokio::task::spawn_blocking(move || ready_rx.recv());
    ready.await.unwrap().unwrap();
    go_tx.send(()).unwrap();
    // The server is "busy": this runtime runs nothing meanwhile.
    std::thread::sleep(BUSY);
    tokio::task::spawn_blocking(move || done_rx.recv().unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn time_a_grpc_request_spent_in_its_socket_counts_as_queue_time() {
    let (server, _c) = common::start(common::test_config()).await;
    let r = lookup_while_busy(common::raw_endpoint(&server))
        .await
        .expect("static limit: the wait is under server.queue_timeout");
    let t = r.timing.unwrap();
    assert!(
        t.queue_us >= 250_000 && t.total_us >= t.queue_us,
        "queue_us {} (total {}): most of the 600 ms in the socket should count",
        t.queue_us,
        t.total_us
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_adaptive_limit_sheds_a_grpc_request_that_queued_in_its_socket() {
    let mut cfg = common::test_config();
    cfg.server.concurrency_limit = kvtier_server::admission::Mode::Adaptive;
    let (server, _c) = common::start(cfg).await;
    // min_rtt is measured over the front's first requests, one at a time.
    let mut c = KvTierClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();
    for _ in 0..kvtier_server::admission::MIN_RTT_SAMPLES + 10 {
        lookup_served(&mut c).await;
    }
    let e = lookup_while_busy(common::raw_endpoint(&server))
        .await
        .expect_err("shed");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("waited in its socket"), "{e:?}");
    assert!(
        e.metadata().get("grpc-retry-pushback-ms").is_some(),
        "{e:?}"
    );
    // At least this one (a loaded machine may shed others on the way).
    assert!(common::shed_total(&server).await >= 1.0);
    // Requests that are not late are served.
    lookup_served(&mut c).await;
    server.shutdown().await.unwrap();
}
