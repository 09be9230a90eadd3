//! Time a data-plane request spends in its socket while the server is busy
//! is queue time: reported in the reply's `queue_us` (from the kernel's
//! receive stamp, SO_TIMESTAMPING), and under the adaptive limit a request
//! that queued too long is shed (notes/028).
mod common;

use bytes::Bytes;
use common::wire::blk;
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use prost::Message;
use tonic::Code;

/// Sends a Read of `ns`/`k` to the data plane at `addr` from another thread
/// while this test's runtime (which runs the server) is blocked: nothing
/// runs until the request is in its socket, and for 300 ms after. Returns
/// the reply's header and metadata.
async fn read_while_busy(addr: std::net::SocketAddr, ns: &str) -> (Header, Bytes) {
    assert!(
        kvtier_server::rx_stamp::kernel_stamps_on(std::time::Duration::from_secs(10)).await,
        "the kernel never stamped a received packet (SO_TIMESTAMPING)"
    );
    let (sent_tx, sent_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(Header, Bytes)>();
    let meta = pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: ns.into(),
            keys: vec![Bytes::from_static(b"k")],
            lease_id: 0,
        }),
        timeout_ms: 0,
        max_reply_bytes: 0,
    }
    .encode_to_vec();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&common::frame(Kind::Read, 7, &meta, &[]))
            .unwrap();
        sent_tx.send(()).unwrap();
        let mut raw = [0u8; HEADER_LEN];
        s.read_exact(&mut raw).unwrap();
        let h = Header::decode(&raw).unwrap();
        let mut m = vec![0u8; h.meta_len as usize + h.data_len as usize];
        s.read_exact(&mut m).unwrap();
        m.truncate(h.meta_len as usize);
        done_tx.send((h, Bytes::from(m))).unwrap();
    });
    // The server is "busy": this runtime runs nothing meanwhile.
    sent_rx.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    tokio::task::spawn_blocking(move || done_rx.recv().unwrap())
        .await
        .unwrap()
}

/// A request that waits in its socket while the server is busy is queued,
/// and says so: its reply's `queue_us` counts from when the kernel received
/// it (SO_TIMESTAMPING), not from when the server got round to reading it.
#[tokio::test]
async fn time_spent_in_the_socket_counts_as_queue_time() {
    let (server, c) = common::start(common::test_config()).await;
    c.write("q", &[blk(b"k", Bytes::from_static(b"v"))])
        .await
        .unwrap();
    let (h, m) = read_while_busy(server.data_addr.unwrap(), "q").await;
    assert_eq!(h.kind, Kind::ReadReply);
    let done = pb::WireReadReply::decode(m).unwrap().done.unwrap();
    assert_eq!(done.returned, 1);
    let t = done.timing.unwrap();
    assert!(
        t.queue_us >= 300_000 && t.total_us >= t.queue_us,
        "queue_us {} (total {}): the 300 ms in the socket should count",
        t.queue_us,
        t.total_us
    );
    server.shutdown().await.unwrap();
}

/// With the adaptive limit, a request that already queued in its socket far
/// past `limit × min_rtt` is shed at once (UNAVAILABLE, counted in
/// `kvtier_shed_total`) instead of being served late (notes/028).
#[tokio::test]
async fn the_adaptive_limit_sheds_a_request_that_queued_in_its_socket() {
    let mut cfg = common::test_config();
    cfg.server.concurrency_limit = kvtier_server::admission::Mode::Adaptive;
    let (server, c) = common::start(cfg).await;
    c.write("q", &[blk(b"k", Bytes::from_static(b"v"))])
        .await
        .unwrap();
    // min_rtt is measured over the front's first requests, one at a time.
    let k = [Key::new(&b"k"[..]).unwrap()];
    for _ in 0..kvtier_server::admission::MIN_RTT_SAMPLES + 10 {
        assert_eq!(c.read("q", &k, 0).await.unwrap().blocks.len(), 1);
    }
    let (h, m) = read_while_busy(server.data_addr.unwrap(), "q").await;
    assert_eq!(h.kind, Kind::Error);
    let e = pb::WireError::decode(m).unwrap();
    assert_eq!(Code::from(e.code), Code::Unavailable, "{}", e.message);
    assert!(e.message.contains("waited in its socket"), "{}", e.message);
    // With the hint a gRPC refusal carries, for the client's back-off.
    assert!(
        (10..=1000).contains(&e.retry_pushback_ms),
        "retry hint {} ms",
        e.retry_pushback_ms
    );
    // At least this one (a loaded machine may shed others on the way).
    assert!(common::shed_total(&server).await >= 1.0);
    server.shutdown().await.unwrap();
}
