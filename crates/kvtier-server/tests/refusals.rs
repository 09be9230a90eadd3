//! Refusals sent before a request's body is read reach a client that sends
//! the whole body first (docs/operations.md, "What a refused client sees"):
//! the server answers, then drains the body (a lingering close) instead of
//! closing on unread bytes, which resets the connection and loses the answer.
//! A request that can never fit is refused as such even when the server is busy.
mod common;

use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{Header, Kind};
use kvtier_server::Server;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1 << 20;

async fn server(request_memory: u64, max_block: u64, max_message: u64) -> Server {
    let mut cfg = common::test_config();
    cfg.server.request_memory = kvtier_core::ByteSize(request_memory);
    cfg.server.max_message_size = kvtier_core::ByteSize(max_message);
    cfg.server.read_timeout = Duration::from_secs(10);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    cfg.engine.max_block_size = kvtier_core::ByteSize(max_block);
    Server::start(cfg).await.unwrap()
}

/// A whole Write frame of one block of `len` bytes.
fn write_frame(len: u64, id: u64) -> Vec<u8> {
    let payload = vec![3u8; len as usize];
    let meta = prost::Message::encode_to_vec(&pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![pb::Block {
                key: b"k".to_vec().into(),
                crc32c: crc32c::crc32c(&payload),
                ..Default::default()
            }],
        }),
        payload_lengths: vec![len],
        timeout_ms: 0,
    });
    common::frame(Kind::Write, id, &meta, &payload)
}

/// Sends all of `bytes` (this must not fail: the server drains what it
/// refused), then reads the answer: an Error frame.
async fn send_then_error(sock: &mut TcpStream, bytes: &[u8]) -> pb::WireError {
    sock.write_all(bytes)
        .await
        .expect("the whole frame is taken, not reset");
    let mut head = [0u8; 24];
    sock.read_exact(&mut head).await.expect("an answer");
    let h = Header::decode(&head).unwrap();
    assert_eq!(h.kind, Kind::Error);
    let mut meta = vec![0u8; h.meta_len as usize];
    sock.read_exact(&mut meta).await.unwrap();
    prost::Message::decode(&meta[..]).unwrap()
}

#[tokio::test]
async fn a_write_over_the_request_memory_is_answered_not_reset() {
    let s = server(32 * MIB, 64 * MIB, 256 * MIB).await;
    let mut c = TcpStream::connect(s.data_addr.unwrap()).await.unwrap();
    let t = Instant::now();
    let e = send_then_error(&mut c, &write_frame(64 * MIB, 1)).await;
    assert_eq!(e.code, tonic::Code::ResourceExhausted as i32, "{e:?}");
    assert!(e.message.contains("server.request_memory"), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Then the connection ends cleanly.
    let mut b = [0u8; 1];
    assert_eq!(c.read(&mut b).await.unwrap(), 0);
}

#[tokio::test]
async fn a_frame_over_the_message_size_is_answered_not_reset() {
    let s = server(64 * MIB, 16 * MIB, 16 * MIB).await;
    let mut c = TcpStream::connect(s.data_addr.unwrap()).await.unwrap();
    let e = send_then_error(&mut c, &write_frame(32 * MIB, 1)).await;
    assert_eq!(e.code, tonic::Code::InvalidArgument as i32, "{e:?}");
    assert!(e.message.contains("server.max_message_size"), "{e:?}");
}

#[tokio::test]
async fn the_rust_client_surfaces_the_refusal_without_retrying() {
    let mut cfg = common::test_config();
    cfg.server.request_memory = kvtier_core::ByteSize(32 * MIB);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    cfg.engine.max_block_size = kvtier_core::ByteSize::mib(64);
    let (_s, client) = common::start(cfg).await;
    let b = kvtier_client::WriteBlock {
        token_ids: Vec::new(),
        key: kvtier_core::Key::new(b"big".to_vec()).unwrap(),
        parent: None,
        token_count: 0,
        payload: bytes::Bytes::from(vec![1u8; 48 << 20]),
        ttl_ms: 0,
    };
    let t = Instant::now();
    let err = client.write("n", &[b]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
    assert!(err.to_string().contains("server.request_memory"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

fn put_head(key: &str, len: u64) -> String {
    format!("PUT /v1/kv/n/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n")
}

/// One HTTP response: the status line and headers, and its body.
async fn response(sock: &mut TcpStream) -> (String, String) {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut b))
            .await
            .expect("a response in time")
            .expect("a response, not a reset");
        assert_eq!(n, 1, "closed before a response: {buf:?}");
        buf.push(b[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body).await.unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn an_http_put_over_the_request_memory_is_413_after_the_whole_body() {
    let s = server(32 * MIB, 64 * MIB, 256 * MIB).await;
    let mut c = TcpStream::connect(s.http_addr.unwrap()).await.unwrap();
    c.write_all(put_head("a", 64 * MIB).as_bytes())
        .await
        .unwrap();
    c.write_all(&vec![0u8; (64 * MIB) as usize])
        .await
        .expect("the whole body is taken, not reset");
    let (head, body) = response(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(body.contains("server.request_memory"), "{body}");
    // The body was drained: the connection carries the next request.
    c.write_all(put_head("b", 3).as_bytes()).await.unwrap();
    c.write_all(b"abc").await.unwrap();
    let (head, _) = response(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 204"), "{head}");
}

#[tokio::test]
async fn an_http_put_over_the_block_size_is_413_with_reqwest() {
    let s = server(256 * MIB, 16 * MIB, 256 * MIB).await;
    let url = format!("http://{}/v1/kv/n/k", s.http_addr.unwrap());
    let r = reqwest::Client::new()
        .put(&url)
        .body(vec![0u8; (40 * MIB) as usize])
        .send()
        .await
        .expect("an answer, not a reset");
    assert_eq!(r.status(), 413);
    let body = r.text().await.unwrap();
    assert!(body.contains("engine.max_block_size"), "{body}");
}

#[tokio::test]
async fn a_request_that_can_never_fit_is_refused_as_such_when_the_server_is_busy() {
    let s = server(32 * MIB, 64 * MIB, 256 * MIB).await;
    // A stalled upload holds 24 of the 32 MiB.
    let mut stalled = TcpStream::connect(s.data_addr.unwrap()).await.unwrap();
    let frame = write_frame(24 * MIB, 1);
    stalled.write_all(&frame[..frame.len() / 2]).await.unwrap();
    let mut held = TcpStream::connect(s.http_addr.unwrap()).await.unwrap();
    held.write_all(put_head("h", 4 * MIB).as_bytes())
        .await
        .unwrap();
    // Busy: a 16 MiB PUT that could fit later is 503 (retry).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = TcpStream::connect(s.http_addr.unwrap()).await.unwrap();
        c.write_all(put_head("b", 16 * MIB).as_bytes())
            .await
            .unwrap();
        c.write_all(&vec![0u8; (16 * MIB) as usize]).await.unwrap();
        let (head, _) = response(&mut c).await;
        if head.starts_with("HTTP/1.1 503") {
            break;
        }
        assert!(Instant::now() < deadline, "never busy: {head}");
    }
    // Never fits: 413 over HTTP, even now.
    let mut c = TcpStream::connect(s.http_addr.unwrap()).await.unwrap();
    c.write_all(put_head("c", 40 * MIB).as_bytes())
        .await
        .unwrap();
    c.write_all(&vec![0u8; (40 * MIB) as usize]).await.unwrap();
    let (head, body) = response(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(body.contains("server.request_memory"), "{body}");
    // And RESOURCE_EXHAUSTED naming the limit (not "busy") on the data plane.
    let mut c = TcpStream::connect(s.data_addr.unwrap()).await.unwrap();
    let e = send_then_error(&mut c, &write_frame(40 * MIB, 2)).await;
    assert_eq!(e.code, tonic::Code::ResourceExhausted as i32, "{e:?}");
    assert!(
        e.message
            .contains("larger than the server's request memory"),
        "{e:?}"
    );
    assert!(e.message.contains("server.request_memory"), "{e:?}");
}

#[tokio::test]
async fn a_chunked_put_over_the_block_size_is_413_after_the_whole_body() {
    let s = server(256 * MIB, 16 * MIB, 256 * MIB).await;
    let mut c = TcpStream::connect(s.http_addr.unwrap()).await.unwrap();
    c.write_all(b"PUT /v1/kv/n/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = vec![0u8; MIB as usize];
    for _ in 0..40 {
        c.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .unwrap();
        c.write_all(&chunk)
            .await
            .expect("the whole body is taken, not reset");
        c.write_all(b"\r\n").await.unwrap();
    }
    c.write_all(b"0\r\n\r\n").await.unwrap();
    let (head, body) = response(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(body.contains("engine.max_block_size"), "{body}");
    // The body was drained: the connection carries the next request.
    c.write_all(put_head("b", 3).as_bytes()).await.unwrap();
    c.write_all(b"abc").await.unwrap();
    let (head, _) = response(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 204"), "{head}");
}

/// Not a frame at all (another protocol talking to the data-plane port):
/// answered with what is wrong, and the rest of what it sent drained, so a
/// client still sending reads the answer instead of a reset.
#[tokio::test]
async fn bytes_that_are_not_a_frame_are_answered_not_reset() {
    let s = server(64 * MIB, 64 * MIB, 256 * MIB).await;
    let mut sock = TcpStream::connect(s.data_addr.unwrap()).await.unwrap();
    let mut junk = b"PUT /v1/kv/n/k HTTP/1.1\r\nContent-Length: 8388608\r\n\r\n".to_vec();
    junk.resize(8 << 20, b'x');
    let e = send_then_error(&mut sock, &junk).await;
    assert_eq!(e.code, tonic::Code::InvalidArgument as i32);
    assert!(e.message.contains("not a kvtier data-plane peer"), "{e:?}");
}

/// A client that sends its refused body slowly reads the answer at once,
/// not after the body: the answer comes first, the drain after it.
#[tokio::test]
async fn a_slow_client_reads_its_refusal_before_it_finished_sending() {
    let s = server(32 * MIB, 64 * MIB, 256 * MIB).await;
    let mut sock = TcpStream::connect(s.data_addr.unwrap()).await.unwrap();
    let frame = write_frame(48 * MIB, 7);
    // The header, the metadata and a first slice of the payload, then a trickle.
    let rest = frame[64 << 10..].to_vec();
    sock.write_all(&frame[..64 << 10]).await.unwrap();
    let (mut rd, mut wr) = sock.into_split();
    let trickle = tokio::spawn(async move {
        for chunk in rest.chunks(64 << 10).take(40) {
            if wr.write_all(chunk).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    });
    let t = Instant::now();
    let mut head = [0u8; 24];
    rd.read_exact(&mut head).await.expect("an answer");
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "answered only after {:?}",
        t.elapsed()
    );
    let h = Header::decode(&head).unwrap();
    assert_eq!((h.kind, h.request_id), (Kind::Error, 7));
    let mut meta = vec![0u8; h.meta_len as usize];
    rd.read_exact(&mut meta).await.unwrap();
    let e: pb::WireError = prost::Message::decode(&meta[..]).unwrap();
    assert_eq!(e.code, tonic::Code::ResourceExhausted as i32);
    assert!(e.message.contains("server.request_memory"), "{e:?}");
    trickle.abort();
}

/// Over gRPC the same refusal arrives as RESOURCE_EXHAUSTED naming the
/// limit, at once and not retried, while other clients keep being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_write_over_the_request_memory_is_refused_under_load() {
    let s = server(32 * MIB, 64 * MIB, 256 * MIB).await;
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    cc.data_plane = false;
    cc.timeout = Duration::from_secs(20);
    let client = kvtier_client::Client::connect(cc).await.unwrap();
    let block = |k: &str, n: usize| kvtier_client::WriteBlock {
        token_ids: Vec::new(),
        key: kvtier_core::Key::new(k.as_bytes().to_vec()).unwrap(),
        parent: None,
        token_count: 0,
        payload: bytes::Bytes::from(vec![5u8; n]),
        ttl_ms: 0,
    };
    // Load: writers of 1 MiB blocks for the whole test.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..4 {
        let (c, stop) = (client.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.write("load", &[block(&format!("w{w}-{n}"), 1 << 20)])
                    .await
                    .expect("other writes are served");
                n += 1;
            }
            n
        }));
    }
    for _ in 0..3 {
        let t = Instant::now();
        let err = client
            .write("n", &[block("big", 48 << 20)])
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
        assert!(err.to_string().contains("server.request_memory"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        assert!(l.await.unwrap() > 0, "each writer was served");
    }
}
