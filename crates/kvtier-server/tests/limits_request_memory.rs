//! Request memory (docs/operations.md): every front (data plane, HTTP, gRPC)
//! reserves a request's body before reading it, refuses what does not fit,
//! cuts a stalled upload at `server.read_timeout` and gives its memory back.
//! A Lookup is charged for its decoded token list, a WriteStream only for
//! the message in hand.
mod common;

use common::limits::{block, closed, grpc_client, http_head, reply, server};
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
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

fn put_head(key: &str, len: usize) -> String {
    format!("PUT /v1/kv/n/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n")
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
    // Uploads 2..5 of 40 MiB each do not fit now: shed at once (UNAVAILABLE
    // with a retry hint: they fit the budget, just not while it is held),
    // the body unread; a body that never comes ends the connection at
    // server.read_timeout.
    let mut shed = Vec::new();
    for i in 0..4 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&write_header("n", 40 << 20, 2)).await.unwrap();
        let t = Instant::now();
        let (h, meta) = reply(&mut c).await.expect("an error frame");
        assert_eq!(h.kind, Kind::Error, "upload {i}");
        let e: pb::WireError = prost::Message::decode(&meta[..]).unwrap();
        assert_eq!(e.code, tonic::Code::Unavailable as i32, "{e:?}");
        assert!(e.retry_pushback_ms > 0, "{e:?}");
        assert!(e.message.contains("retry"), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "refused quickly");
        shed.push(c);
    }
    for c in &mut shed {
        assert!(closed(c, Duration::from_secs(5)).await, "bodies never sent");
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
        m.contains(r#"kvtier_requests_total{api="wire",op="admit",code="unavailable"} 4"#),
        "{m}"
    );
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
