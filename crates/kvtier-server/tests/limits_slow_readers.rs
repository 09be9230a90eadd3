//! Clients that stop reading: a reply nobody takes (data plane or gRPC)
//! holds its admission slot for at most `server.write_timeout`, then the
//! slot comes back; and a connection that no longer reads does not hold up
//! the server's shutdown.
mod common;

use common::limits::{block, grpc_client, reply};
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use kvtier_server::Server;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A server that serves one request at a time and queues none, whose
/// connections count as idle after 500 ms, and whose replies are dropped
/// when their client takes nothing of them for 500 ms.
async fn one_at_a_time() -> Server {
    let mut cfg = common::test_config();
    cfg.server.max_inflight = 1;
    cfg.server.max_queued = 0;
    cfg.server.idle_timeout = Duration::from_millis(500);
    cfg.server.write_timeout = Duration::from_millis(500);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    cfg.engine.max_block_size = kvtier_core::ByteSize::mib(64);
    Server::start(cfg).await.unwrap()
}

/// A data-plane Read of key `key` in namespace `n`.
fn read_frame(key: &'static [u8], id: u64) -> Vec<u8> {
    let meta = prost::Message::encode_to_vec(&pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: "n".into(),
            keys: vec![bytes::Bytes::from_static(key)],
            lease_id: 0,
        }),
        timeout_ms: 0,
        max_reply_bytes: 0,
    });
    common::frame(Kind::Read, id, &meta, &[])
}

/// A client that stops reading a large reply holds its request's admission
/// slot for at most `server.write_timeout`: the write that waits on it that
/// long fails, the connection is closed and the slot given back. Before, the
/// reply's write had no bound, and with `max_inflight = 1` every other
/// request was shed for as long as the client kept its socket open.
#[tokio::test]
async fn a_data_plane_reply_the_client_does_not_take_gives_its_slot_back() {
    let s = one_at_a_time().await;
    let addr = s.data_addr.unwrap();
    grpc_client(&s)
        .await
        .write("n", &[block("big", 32 << 20)])
        .await
        .expect("a 32 MiB block stored");
    // A Read of it from a socket with a small receive buffer that never reads:
    // 32 MiB do not fit in the sockets' buffers, so the reply's write waits.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut stuck = sock.connect(addr).await.unwrap();
    stuck.write_all(&read_frame(b"big", 1)).await.unwrap();
    let stuck_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Another Read: answered, or shed (an UNAVAILABLE error frame).
    let probe = async || {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&read_frame(b"missing", 2)).await.unwrap();
        reply(&mut c).await.expect("a reply").0.kind
    };
    assert_eq!(probe().await, Kind::Error, "shed while the slot is held");
    let deadline = Instant::now() + Duration::from_secs(5);
    while probe().await != Kind::ReadReply {
        assert!(
            Instant::now() < deadline,
            "the slot of a reply nobody takes was never given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stuck_at.elapsed() >= Duration::from_millis(450),
        "given back before server.write_timeout: {:?}",
        stuck_at.elapsed()
    );
    // The stuck connection was closed: what it can read ends.
    let mut sink = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), stuck.read_to_end(&mut sink)).await;
    assert!(end.is_ok(), "the stuck connection is still open");
    assert!(sink.len() < 32 << 20, "the whole reply went out");
}

/// Over gRPC too: a Read whose client grants no HTTP/2 window (it takes
/// nothing of the reply) gives its admission back after
/// `server.write_timeout`. HTTP/2 flow control means the server's writes
/// never wait there; hyper just stops asking the reply for more, so before,
/// the stream held the slot for ever and every other request was shed.
#[tokio::test]
async fn a_grpc_reply_the_client_does_not_take_gives_its_slot_back() {
    let s = one_at_a_time().await;
    let c = grpc_client(&s).await;
    c.write("n", &[block("a", 1 << 20), block("b", 1 << 20)])
        .await
        .expect("two blocks stored");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.grpc_addrs[0]))
        .unwrap()
        .initial_stream_window_size(Some(0))
        .connect()
        .await
        .unwrap();
    let mut raw = kvtier_proto::v1::kv_tier_client::KvTierClient::new(channel);
    // A Read of two blocks: the server takes the first, and can send nothing.
    let stuck = raw
        .read(pb::ReadRequest {
            namespace: "n".into(),
            keys: vec![
                bytes::Bytes::from_static(b"a"),
                bytes::Bytes::from_static(b"b"),
            ],
            lease_id: 0,
        })
        .await
        .expect("the Read's headers");
    let stuck_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let e = c.stats().await.expect_err("shed while the slot is held");
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = c.stats().await {
        assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
        assert!(
            Instant::now() < deadline,
            "the slot of a reply nobody takes was never given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stuck_at.elapsed() >= Duration::from_millis(450),
        "given back before server.write_timeout: {:?}",
        stuck_at.elapsed()
    );
    // And the stuck stream ends (its connection, no longer in use, is
    // closed as idle) instead of lingering for ever.
    let mut stuck = stuck.into_inner();
    let end = tokio::time::timeout(Duration::from_secs(5), stuck.message()).await;
    assert!(
        matches!(end, Ok(Err(_))),
        "the stuck stream is still open: {end:?}"
    );
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_grpc_client_that_stopped_reading() {
    // HTTP/2's graceful close sends GOAWAY and a PING and waits for the
    // answer; a client that is not reading its socket (an engine idle
    // between requests) never answers. The server must still stop well
    // within its grace period, as soon as the connection has no request.
    let mut cfg = common::test_config();
    cfg.server.shutdown_grace = Duration::from_secs(30);
    let s = Server::start(cfg).await.unwrap();
    let mut quiet = TcpStream::connect(s.grpc_addrs[0]).await.unwrap();
    quiet
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    // The server's SETTINGS: the connection is up. Nothing is read after.
    let mut settings = [0u8; 9];
    quiet.read_exact(&mut settings).await.unwrap();
    assert_eq!(settings[3], 4, "a SETTINGS frame first");
    // A client with a request every so often is served until the stop.
    let busy = common::client_for(&s).await;
    busy.stats().await.expect("served");
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), s.shutdown())
        .await
        .expect("shutdown held by a connection with nothing in service")
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(quiet);
}
