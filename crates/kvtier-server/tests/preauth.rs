//! What a client with no token can hold (docs/security.md, "Threats and
//! their guards"): nothing of the shared request memory. On the data plane
//! only a small Hello is read before a token is named; over gRPC a call is
//! authenticated on its headers, before its body is read or charged.
//! Each test plays the attacker against a real server and checks that
//! authenticated writes over HTTP and gRPC are still served at once.
mod common;

use common::limits::{block, closed, reply, until_read_by_server};
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use kvtier_server::Server;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const TOKEN: &str = "token-for-the-tenant-0001";

/// A server with tokens, 128 MiB of request memory and a long read timeout
/// (what a stalled attacker would hold the budget for).
async fn server() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(
        &path,
        format!("[[tokens]]\ntoken = \"{TOKEN}\"\nnamespaces = [\"\"]\naccess = \"read-write\"\n"),
    )
    .unwrap();
    let mut cfg = common::test_config();
    cfg.auth.tokens_file = path.to_string_lossy().into();
    cfg.server.request_memory = kvtier_core::ByteSize::mib(128);
    cfg.server.read_timeout = Duration::from_secs(60);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    cfg.engine.max_block_size = kvtier_core::ByteSize::mib(64);
    (Server::start(cfg).await.unwrap(), dir)
}

/// An authenticated 4 MiB HTTP PUT and gRPC Write, each answered within
/// two seconds.
async fn authenticated_writes_succeed(s: &Server, tag: &str) {
    let url = format!("http://{}/v1/kv/n/{tag}", s.http_addr.unwrap());
    let started = Instant::now();
    let put = reqwest::Client::new()
        .put(&url)
        .bearer_auth(TOKEN)
        .body(vec![5u8; 4 << 20])
        .send()
        .await
        .unwrap();
    let status = put.status();
    assert!(
        status.is_success(),
        "{tag}: HTTP PUT {status}: {}",
        put.text().await.unwrap_or_default()
    );
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    cc.data_plane = false;
    cc.retries = 0;
    cc.token = Some(TOKEN.into());
    let c = kvtier_client::Client::connect(cc).await.unwrap();
    c.write("n", &[block(&format!("{tag}-grpc"), 4 << 20)])
        .await
        .unwrap_or_else(|e| panic!("{tag}: gRPC Write: {e}"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{tag}: {:?}",
        started.elapsed()
    );
}

/// Two raw connections each send a 24-byte header announcing 127 MiB of
/// metadata, then nothing. Before, each header's metadata was reserved
/// from the request memory before Hello: the first held 127 of its 128 MiB
/// for `server.read_timeout` and every authenticated write was refused as
/// busy. Now each is refused on its header (UNAUTHENTICATED, then closed)
/// and nothing is held.
#[tokio::test]
async fn a_header_before_hello_holds_no_request_memory() {
    let (s, _dir) = server().await;
    let addr = s.data_addr.unwrap();
    let mut attackers = Vec::new();
    for (id, kind) in [(1, Kind::Read), (2, Kind::Hello)] {
        let head = Header {
            kind,
            request_id: id,
            meta_len: 127 << 20,
            data_len: 0,
        }
        .encode();
        assert_eq!(head.len(), HEADER_LEN);
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.write_all(&head).await.unwrap();
        until_read_by_server(&sock).await;
        attackers.push((kind, sock));
    }
    authenticated_writes_succeed(&s, "after-headers").await;
    for (kind, mut sock) in attackers {
        let (h, meta) = tokio::time::timeout(Duration::from_secs(5), reply(&mut sock))
            .await
            .unwrap_or_else(|_| panic!("{kind:?}: no answer to the header"))
            .unwrap_or_else(|| panic!("{kind:?}: closed without an answer"));
        assert_eq!(h.kind, Kind::Error, "{kind:?}");
        let e: kvtier_proto::v1::WireError = prost::Message::decode(&meta[..]).unwrap();
        let want = if kind == Kind::Hello {
            tonic::Code::InvalidArgument
        } else {
            tonic::Code::Unauthenticated
        };
        assert_eq!(e.code, want as i32, "{kind:?}: {e:?}");
        assert!(closed(&mut sock, Duration::from_secs(5)).await, "{kind:?}");
    }
    // A client with a token is served on the data plane as before.
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    cc.token = Some(TOKEN.into());
    let c = kvtier_client::Client::connect(cc).await.unwrap();
    c.write("n", &[block("data-plane", 4 << 20)]).await.unwrap();
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

/// A kvstore Lookup with no token whose 14 MiB body arrives, then stalls
/// (the stream stays open). Before, the body was received and charged (9×
/// for a kvstore Lookup: 126 of 128 MiB) before the handler read its
/// `authorization`, and authenticated writes were refused as busy until the
/// stream closed. Now the call is answered UNAUTHENTICATED on its headers.
#[tokio::test]
async fn a_grpc_call_without_a_token_is_refused_before_its_body_is_charged() {
    let (s, _dir) = server().await;
    let addr = s.grpc_addrs[0];
    // A valid Lookup of 4.9 M tokens (3-byte varints: 14 MiB), so that the
    // server, without the guard, decodes it and then waits for the body's
    // end (unary calls are read to their end) holding its charge.
    let lookup = prost::Message::encode_to_vec(&kvtier_proto::kvstore::LookupRequest {
        tokens: vec![1 << 20; (14 << 20) / 3],
        ..Default::default()
    });
    assert!(lookup.len() > 13 << 20, "{}", lookup.len());
    let mut body = vec![0u8];
    body.extend_from_slice(&(lookup.len() as u32).to_be_bytes());
    body.extend_from_slice(&lookup);
    for authorization in [None, Some("Bearer not-a-token-of-this-server")] {
        let mut req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/kvstore.KVStoreService/Lookup"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let req = req
            .body(tonic::body::Body::new(Stalling(Some(body.clone().into()))))
            .unwrap();
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        // The call runs on (its body stalled) whether or not it is answered.
        let mut call = tokio::spawn(tower::ServiceExt::oneshot(channel.clone(), req));
        let answered = tokio::time::timeout(Duration::from_secs(5), &mut call).await;
        // Meanwhile, with the stalled call still open: served at once.
        authenticated_writes_succeed(&s, &format!("after-{}", authorization.is_some())).await;
        let answer = answered
            .expect("no answer while the body stalls")
            .unwrap()
            .unwrap();
        let status = tonic::Status::from_header_map(answer.headers())
            .unwrap_or_else(|| panic!("a trailers-only error, got {answer:?}"));
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        call.abort();
        drop((answer, channel));
    }
    // Health stays public (auth.public_health).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health is public");
}
