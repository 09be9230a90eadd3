//! The data plane's limits (docs/operations.md): request memory reserved
//! before a body is read, stalled uploads timed out and their memory
//! released, idle connections closed, a connection cap.
mod common;

use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{Header, Kind};
use kvtier_server::Server;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn write_header(ns: &str, payload: u32, id: u64) -> Vec<u8> {
    let meta = prost::Message::encode_to_vec(&pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: ns.into(),
            blocks: vec![pb::Block {
                key: b"k".to_vec().into(),
                ..Default::default()
            }],
        }),
        payload_lengths: vec![u64::from(payload)],
        timeout_ms: 0,
    });
    let mut f = common::frame(Kind::Write, id, &meta, &[]);
    f[20..24].copy_from_slice(&payload.to_le_bytes());
    f
}

/// The next frame's header and metadata, or None when the server closed.
async fn reply(sock: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut head = [0u8; 24];
    sock.read_exact(&mut head).await.ok()?;
    let h = Header::decode(&head).unwrap();
    let mut meta = vec![0u8; h.meta_len as usize];
    sock.read_exact(&mut meta).await.ok()?;
    Some((h, meta))
}

async fn closed(sock: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(within, sock.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

async fn server(memory: u64, conns: usize, idle_ms: u64, read_ms: u64) -> Server {
    let mut cfg = common::test_config();
    cfg.server.request_memory = kvtier_core::ByteSize(memory);
    cfg.server.max_connections = conns;
    cfg.server.idle_timeout = Duration::from_millis(idle_ms);
    cfg.server.read_timeout = Duration::from_millis(read_ms);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    cfg.engine.max_block_size = kvtier_core::ByteSize::mib(64);
    Server::start(cfg).await.unwrap()
}

#[tokio::test]
async fn stalled_uploads_cannot_hold_more_than_the_request_memory() {
    let s = server(64 << 20, 100, 60_000, 1_500).await;
    let addr = s.data_addr.unwrap();
    // Upload 1 claims 40 MiB, sends 1 MiB of it and stalls: 40 MiB are reserved.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(&write_header("n", 40 << 20, 1))
        .await
        .unwrap();
    stalled.write_all(&vec![0u8; 1 << 20]).await.unwrap();
    // Uploads 2..5 of 40 MiB each do not fit: refused at once, body unread.
    for i in 0..4 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&write_header("n", 40 << 20, 2)).await.unwrap();
        let t = Instant::now();
        let (h, meta) = reply(&mut c).await.expect("an error frame");
        assert_eq!(h.kind, Kind::Error, "upload {i}");
        let e: pb::WireError = prost::Message::decode(&meta[..]).unwrap();
        assert_eq!(e.code, tonic::Code::ResourceExhausted as i32, "{e:?}");
        assert!(e.message.contains("retry"), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "refused quickly");
        assert!(closed(&mut c, Duration::from_secs(2)).await);
    }
    // The stalled upload is cut at server.read_timeout, and its 40 MiB freed:
    // the next upload of the same size is accepted and stored.
    assert!(
        closed(&mut stalled, Duration::from_secs(5)).await,
        "stalled upload closed"
    );
    let payload = vec![7u8; 40 << 20];
    let crc = crc32c::crc32c(&payload);
    let meta = prost::Message::encode_to_vec(&pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![pb::Block {
                key: b"k".to_vec().into(),
                crc32c: crc,
                ..Default::default()
            }],
        }),
        payload_lengths: vec![payload.len() as u64],
        timeout_ms: 0,
    });
    let mut ok = TcpStream::connect(addr).await.unwrap();
    ok.write_all(&common::frame(Kind::Write, 3, &meta, &payload))
        .await
        .unwrap();
    let (h, meta) = reply(&mut ok).await.unwrap();
    assert_eq!(
        h.kind,
        Kind::WriteReply,
        "{:?}",
        String::from_utf8_lossy(&meta)
    );
    let m = common::metrics(&s).await;
    assert!(
        m.contains(r#"kvtier_requests_total{api="wire",op="admit",code="resource_exhausted"} 4"#),
        "{m}"
    );
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let s = server(64 << 20, 100, 300, 60_000).await;
    let addr = s.data_addr.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    assert!(closed(&mut idle, Duration::from_secs(5)).await);
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    // Half a header counts as idle too.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"KVW1\x01").await.unwrap();
    assert!(closed(&mut half, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_accept() {
    let s = server(64 << 20, 3, 60_000, 60_000).await;
    let addr = s.data_addr.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // The fourth connection is accepted by the kernel but closed by the server
    // (it accepts in order, so the first three hold the slots by then).
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed(&mut extra, Duration::from_secs(5)).await,
        "fourth closed"
    );
    // The three held ones are still served.
    held[0]
        .write_all(&common::frame(Kind::Read, 1, &[], &[]))
        .await
        .unwrap();
    assert!(reply(&mut held[0]).await.is_some());
    drop(held);
    // Once others close, new connections are served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = TcpStream::connect(addr).await.unwrap();
        again
            .write_all(&common::frame(Kind::Read, 1, &[], &[]))
            .await
            .unwrap();
        if reply(&mut again).await.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "slots never freed");
    }
}

/// The status line and headers of an HTTP response, or None when closed.
async fn http_head(sock: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut b)).await {
            Ok(Ok(1)) => buf.push(b[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn put_head(key: &str, len: usize) -> String {
    format!("PUT /v1/kv/n/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n")
}

#[tokio::test]
async fn stalled_http_uploads_cannot_hold_more_than_the_request_memory() {
    let s = server(64 << 20, 100, 60_000, 1_500).await;
    let addr = s.http_addr.unwrap();
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(put_head("a", 40 << 20).as_bytes())
        .await
        .unwrap();
    stalled.write_all(&vec![0u8; 1 << 20]).await.unwrap();
    // Wait until the stalled upload holds its reservation (it is charged when
    // its headers are in): then the next 40 MiB PUT does not fit.
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(put_head("b", 40 << 20).as_bytes())
            .await
            .unwrap();
        let head = http_head(&mut c).await.expect("a response before the body");
        if head.starts_with("HTTP/1.1 503") {
            break head;
        }
        assert!(Instant::now() < deadline, "never refused: {head}");
    };
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    // Counted as an answered HTTP PUT with its numeric status (docs/operations.md).
    let m = common::metrics(&s).await;
    assert!(
        m.lines().any(|l| l.starts_with("kvtier_requests_total{")
            && l.contains("api=\"http\"")
            && l.contains("op=\"put\"")
            && l.contains("code=\"503\"")),
        "{m}"
    );
    // The stalled upload is answered 408 at server.read_timeout; its memory is
    // given back and a whole 40 MiB PUT is stored.
    let head = http_head(&mut stalled).await.expect("408");
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    let mut ok = TcpStream::connect(addr).await.unwrap();
    ok.write_all(put_head("c", 40 << 20).as_bytes())
        .await
        .unwrap();
    ok.write_all(&vec![9u8; 40 << 20]).await.unwrap();
    let head = http_head(&mut ok).await.expect("a response");
    assert!(head.starts_with("HTTP/1.1 2"), "{head}");
}

#[tokio::test]
async fn idle_and_surplus_http_connections_are_closed() {
    let s = server(64 << 20, 2, 300, 60_000).await;
    let addr = s.http_addr.unwrap();
    // Idle: no request at all, and a kept-alive connection after its request.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed(&mut idle, Duration::from_secs(5)).await,
        "idle HTTP connection closed"
    );
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let head = http_head(&mut kept).await.expect("answered");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // (the rest of the response, then EOF once the connection is idle)
    let mut rest = Vec::new();
    let eof = tokio::time::timeout(Duration::from_secs(5), kept.read_to_end(&mut rest)).await;
    assert!(
        matches!(eof, Ok(Ok(_))),
        "kept-alive connection closed when idle: {eof:?}"
    );
    // Cap: with 2 held, a third is closed at accept.
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let t = Instant::now();
    let n = tokio::time::timeout(Duration::from_millis(250), c.read_to_end(&mut buf)).await;
    assert!(
        matches!(n, Ok(Ok(0))),
        "third connection closed at once: {n:?}"
    );
    assert!(t.elapsed() < Duration::from_millis(250));
    for x in [&mut a, &mut b] {
        x.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(http_head(x).await.unwrap().starts_with("HTTP/1.1 200"));
    }
}

/// A client of `s` over gRPC only (no data plane), without retries.
async fn grpc_client(s: &Server) -> kvtier_client::Client {
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    cc.data_plane = false;
    cc.retries = 0;
    cc.timeout = Duration::from_secs(20);
    kvtier_client::Client::connect(cc).await.unwrap()
}

/// A block of `n` bytes under key `k`.
fn block(k: &str, n: usize) -> kvtier_client::WriteBlock {
    kvtier_client::WriteBlock {
        key: kvtier_core::Key::new(k.as_bytes().to_vec()).unwrap(),
        parent: None,
        token_count: 0,
        payload: bytes::Bytes::from(vec![3u8; n]),
        ttl_ms: 0,
    }
}

#[tokio::test]
async fn grpc_request_bodies_are_charged_to_the_request_memory() {
    let s = server(64 << 20, 100, 60_000, 60_000).await;
    let c = grpc_client(&s).await;
    // Larger than the whole budget: refused while it arrives.
    let e = c
        .write("n", &[block("big", 80 << 20)])
        .await
        .expect_err("an 80 MiB body against 64 MiB of request memory");
    assert_eq!(e.code(), Some(tonic::Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains("request memory"), "{e}");
    // What it held was given back: bodies up to the budget still go through,
    // again and again.
    for i in 0..3 {
        c.write("n", &[block(&format!("ok{i}"), 40 << 20)])
            .await
            .expect("a 40 MiB write fits");
    }
}

/// A request body that sends `first`, then nothing, for ever.
struct Stalling(Option<bytes::Bytes>);

impl http_body::Body for Stalling {
    type Data = bytes::Bytes;
    type Error = tonic::Status;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(b) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
            None => std::task::Poll::Pending,
        }
    }
}

/// A gRPC upload that stalls mid-body is cut after `server.read_timeout`
/// (DEADLINE_EXCEEDED), and the request memory its bytes held is given
/// back: without the cut it would hold them, and its stream, for ever.
#[tokio::test]
async fn a_stalled_grpc_upload_is_cut_and_its_memory_given_back() {
    let s = server(64 << 20, 100, 60_000, 500).await;
    let addr = s.grpc_addrs[0];
    let c = grpc_client(&s).await;
    for (path, what) in [
        ("/kvtier.v1.KvTier/Write", "unary"),
        ("/kvtier.v1.KvTier/WriteStream", "client streaming"),
    ] {
        // A gRPC message announcing 48 MiB, of which 24 MiB arrive.
        let mut body = vec![0u8];
        body.extend_from_slice(&(48u32 << 20).to_be_bytes());
        body.resize(5 + (24 << 20), 7);
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(Stalling(Some(body.into()))))
            .unwrap();
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let started = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            tower::ServiceExt::oneshot(channel, req),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: a stalled upload was never cut"))
        .unwrap();
        let status = tonic::Status::from_header_map(answer.headers())
            .unwrap_or_else(|| panic!("{what}: a trailers-only error, got {answer:?}"));
        assert_eq!(
            status.code(),
            tonic::Code::DeadlineExceeded,
            "{what}: {status:?}"
        );
        assert!(status.message().contains("read_timeout"), "{status:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(450),
            "{what}: cut early"
        );
        // What the 24 MiB held is back: 60 MiB of the 64 fit again.
        c.write("n", &[block(what, 60 << 20)])
            .await
            .unwrap_or_else(|e| panic!("{what}: memory not given back: {e}"));
    }
}

/// A gRPC client on one connection, no retries, that has been answered once.
async fn one_connection_client(
    addr: std::net::SocketAddr,
) -> Result<kvtier_client::Client, kvtier_client::ClientError> {
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{addr}"));
    cc.connections = 1;
    cc.data_plane = false;
    cc.retries = 0;
    cc.timeout = Duration::from_secs(3);
    let c = kvtier_client::Client::connect(cc).await?;
    c.stats().await?;
    Ok(c)
}

#[tokio::test]
async fn grpc_connections_beyond_the_cap_are_closed() {
    let s = server(64 << 20, 2, 60_000, 60_000).await;
    let client = || one_connection_client(s.grpc_addrs[0]);
    let a = client().await.expect("first");
    let b = client().await.expect("second");
    assert!(client().await.is_err(), "a third connection is refused");
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client().await.is_err() {
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.stats().await.expect("the held connection still serves");
}

#[tokio::test]
async fn idle_grpc_connections_are_closed_and_busy_ones_kept() {
    // One connection slot, 400 ms idle timeout: a second client gets in only
    // once the first one's connection was closed for idleness.
    let s = server(64 << 20, 1, 400, 60_000).await;
    let client = || one_connection_client(s.grpc_addrs[0]);
    // A raw TCP connection that never speaks is closed after the timeout.
    // (The server speaks first, its HTTP/2 SETTINGS; then EOF.)
    let mut silent = TcpStream::connect(s.grpc_addrs[0]).await.unwrap();
    let t = Instant::now();
    let mut sink = Vec::new();
    let eof = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut sink)).await;
    assert!(
        matches!(eof, Ok(Ok(_))),
        "silent connection closed: {eof:?}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t.elapsed()
    );
    let a = client().await.expect("first");
    // Busy (a request every 100 ms, for three idle timeouts): kept open, so
    // the slot stays taken.
    let busy_until = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < busy_until {
        a.stats().await.expect("the busy connection serves");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            TcpStream::connect(s.grpc_addrs[0]).await.is_ok(),
            "accept still works"
        );
    }
    assert!(
        client().await.is_err(),
        "the busy connection holds the slot"
    );
    // Idle: closed after the timeout, the slot comes back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        match client().await {
            Ok(b) => break b,
            Err(_) => {
                assert!(
                    Instant::now() < deadline,
                    "the idle connection was never closed"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    b.stats().await.expect("the new connection serves");
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

/// A Lookup's token list decodes larger than it arrives (a one-byte varint
/// becomes a 4-byte `uint32`), so its body is charged for both: 2 MiB of
/// tokens take 10 MiB of an 8 MiB request memory and are refused, while a
/// 2 MiB block (charged as it arrives) and a small Lookup are served.
#[tokio::test]
async fn a_lookup_is_charged_for_its_decoded_token_list() {
    let s = server(8 << 20, 100, 60_000, 5_000).await;
    let mut raw = kvtier_proto::v1::kv_tier_client::KvTierClient::connect(format!(
        "http://{}",
        s.grpc_addrs[0]
    ))
    .await
    .unwrap()
    .max_encoding_message_size(64 << 20);
    let lookup = |n: usize| pb::LookupRequest {
        namespace: "n".into(),
        tokens: vec![7; n],
        block_size: 128,
        ..Default::default()
    };
    let e = raw.lookup(lookup(2 << 20)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let small = raw.lookup(lookup(1 << 16)).await.unwrap().into_inner();
    assert_eq!(small.found_blocks, 0);
    let payload = bytes::Bytes::from(vec![1u8; 2 << 20]);
    let w = raw
        .write(pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![pb::Block {
                key: bytes::Bytes::from_static(b"two-mib"),
                crc32c: crc32c::crc32c(&payload),
                payload,
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.stored, 1);
}

/// A server that serves one request at a time and queues none, whose
/// connections count as idle after 500 ms.
async fn one_at_a_time() -> Server {
    let mut cfg = common::test_config();
    cfg.server.max_inflight = 1;
    cfg.server.max_queued = 0;
    cfg.server.idle_timeout = Duration::from_millis(500);
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
/// slot for at most `server.idle_timeout`: the write that waits on it that
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
        "given back before server.idle_timeout: {:?}",
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
/// `server.idle_timeout`. HTTP/2 flow control means the server's writes
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
        "given back before server.idle_timeout: {:?}",
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

/// A `WriteStream` is charged for the message in hand, not for everything
/// it sent: each message's bytes are given back once its blocks are stored.
/// Ten 8 MiB messages go through 64 MiB of request memory (before, the
/// stream held every frame's charge until it ended and failed part way with
/// RESOURCE_EXHAUSTED, and an open stream starved every other request).
#[tokio::test]
async fn a_write_stream_is_charged_only_for_the_message_in_hand() {
    let s = server(64 << 20, 100, 60_000, 60_000).await;
    let mut raw = kvtier_proto::v1::kv_tier_client::KvTierClient::connect(format!(
        "http://{}",
        s.grpc_addrs[0]
    ))
    .await
    .unwrap();
    let messages = (0..10).map(|i| {
        let payload = bytes::Bytes::from(vec![i as u8; 8 << 20]);
        pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![pb::Block {
                key: bytes::Bytes::from(format!("part{i}")),
                crc32c: crc32c::crc32c(&payload),
                payload,
                ..Default::default()
            }],
        }
    });
    let w = raw
        .write_stream(tokio_stream::iter(messages))
        .await
        .expect("80 MiB in 8 MiB messages through 64 MiB of request memory")
        .into_inner();
    assert_eq!(w.stored, 10);
    // Nothing stays charged: a write of most of the budget fits at once.
    grpc_client(&s)
        .await
        .write("n", &[block("after", 60 << 20)])
        .await
        .expect("the stream's memory was given back");
}
