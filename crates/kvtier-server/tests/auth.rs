//! Authentication and tenant isolation on every API (docs/security.md): a
//! token for namespace prefix `a/` is refused on `b/` by kvtier.v1, the
//! kvstore protocol, HTTP and the data plane; no token is UNAUTHENTICATED /
//! 401; a read-only token cannot write; one tenant cannot poison another's
//! chain; the server refuses to listen beyond loopback without tokens.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::{HashFn, Key};
use kvtier_proto::kvstore as kpb;
use kvtier_proto::kvstore::kv_store_service_client::KvStoreServiceClient;
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use kvtier_server::Server;
use tonic::Code;

const A: &str = "token-for-tenant-a-0001";
const B: &str = "token-for-tenant-b-0002";
const RO: &str = "read-only-token-a-0003";

const TOKENS: &str = r#"
[[tokens]]
token = "token-for-tenant-a-0001"
namespaces = ["a/"]
access = "read-write"
name = "tenant a"

[[tokens]]
token = "token-for-tenant-b-0002"
namespaces = ["b/", "kvstore:acct-b/"]
access = "read-write"
name = "tenant b"

[[tokens]]
token = "read-only-token-a-0003"
namespaces = ["a/"]
access = "read"
"#;

async fn server() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, TOKENS).unwrap();
    let mut cfg = common::test_config();
    cfg.auth.tokens_file = path.to_string_lossy().into();
    (Server::start(cfg).await.expect("starts"), dir)
}

async fn client(s: &Server, token: Option<&str>) -> Result<Client, kvtier_client::ClientError> {
    let mut c = ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    c.connections = 1;
    c.token = token.map(str::to_string);
    Client::connect(c).await
}

fn blocks(n: usize, seed: u8) -> (Vec<Key>, Vec<WriteBlock>) {
    let tokens: Vec<u32> = (0..(128 * n) as u32).collect();
    let keys = HashFn::Xxh3_64V1.chain(&tokens, 128).unwrap();
    let wb = keys
        .iter()
        .enumerate()
        .map(|(i, k)| WriteBlock {
            token_ids: Vec::new(),
            key: k.clone(),
            parent: (i > 0).then(|| keys[i - 1].clone()),
            token_count: 128,
            payload: Bytes::from(vec![seed; 1000 + i]),
            ttl_ms: 0,
        })
        .collect();
    (keys, wb)
}

fn code<T>(r: Result<T, kvtier_client::ClientError>) -> Option<Code> {
    r.err().and_then(|e| e.code())
}

#[tokio::test]
async fn v1_and_the_data_plane_keep_tenants_apart() {
    let (s, _dir) = server().await;
    assert_eq!(
        code(client(&s, None).await),
        Some(Code::Unauthenticated),
        "connect asks Stats, which needs a token"
    );
    assert_eq!(
        code(client(&s, Some("not-a-real-token-xxxx")).await),
        Some(Code::Unauthenticated)
    );
    let a = client(&s, Some(A)).await.unwrap();
    assert!(a.data_plane().is_some(), "Hello accepted on the data plane");
    let b = client(&s, Some(B)).await.unwrap();
    let ro = client(&s, Some(RO)).await.unwrap();
    let (keys, wb) = blocks(3, 7);

    // a/ is tenant a's: it writes (over the data plane) and reads back.
    let w = a.write("a/model", &wb).await.unwrap();
    assert_eq!(w.stored, 3);
    assert_eq!(a.lookup("a/model", &keys, None).await.unwrap().found, 3);
    assert_eq!(a.read("a/model", &keys, 0).await.unwrap().blocks.len(), 3);

    // Tenant b on a/: every operation is PERMISSION_DENIED, nothing leaks.
    assert_eq!(
        code(b.lookup("a/model", &keys, None).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(b.read("a/model", &keys, 0).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(b.write("a/model", &wb).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(b.delete("a/model", &keys[..1]).await),
        Some(Code::PermissionDenied)
    );
    let ch = tonic::transport::Endpoint::from_shared(common::raw_endpoint(&s))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut b_raw = KvTierClient::with_interceptor(ch, |mut r: tonic::Request<()>| {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {B}").parse().unwrap());
        Ok(r)
    });
    let st = b_raw
        .lease(pb::LeaseRequest {
            namespace: "a/model".into(),
            keys: keys.iter().map(Key::bytes).collect(),
            lease_ms: 1000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::PermissionDenied);
    // Poisoning: b cannot pre-write a's chain (it would be refused above), and
    // b's own copy of the same chain lives in b's namespace, invisible to a.
    let (_, poison) = blocks(3, 0xEE);
    assert_eq!(b.write("b/model", &poison).await.unwrap().stored, 3);
    let mine = a.read("a/model", &keys, 0).await.unwrap();
    assert!(
        mine.blocks.iter().all(|x| x.payload[0] == 7),
        "a still reads its own bytes"
    );

    // Read-only: reads yes, writes and deletes no.
    assert_eq!(ro.lookup("a/model", &keys, None).await.unwrap().found, 3);
    assert_eq!(
        code(ro.write("a/other", &wb).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(ro.delete("a/model", &keys[..1]).await),
        Some(Code::PermissionDenied)
    );

    // gRPC without a token, straight to the service (no client-side checks).
    let mut raw = KvTierClient::connect(common::raw_endpoint(&s))
        .await
        .unwrap();
    let st = raw
        .lookup(pb::LookupRequest {
            namespace: "a/model".into(),
            keys: keys.iter().map(Key::bytes).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated);
    assert!(st.message().contains("Bearer"), "{st:?}");

    let m = common::metrics(&s).await;
    assert!(
        m.contains("kvtier_auth_denied_total{reason=\"permission_denied\"}"),
        "{m}"
    );
    assert!(
        m.contains("kvtier_auth_denied_total{reason=\"unauthenticated\"}"),
        "{m}"
    );
}

#[tokio::test]
async fn the_data_plane_without_hello_is_refused_before_the_payload() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (s, _dir) = server().await;
    let addr = s.data_addr.unwrap();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A Write claiming 64 MiB of payload, sent without a Hello: refused on the
    // header and metadata alone, the connection closed.
    let meta = prost::Message::encode_to_vec(&pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: "a/x".into(),
            blocks: vec![pb::Block::default()],
        }),
        payload_lengths: vec![64 << 20],
        timeout_ms: 0,
    });
    let mut f = common::frame(kvtier_proto::wire::Kind::Write, 9, &meta, &[]);
    // Patch the header's data length (the payload is never sent).
    f[20..24].copy_from_slice(&(64u32 << 20).to_le_bytes());
    sock.write_all(&f).await.unwrap();
    let mut head = [0u8; 24];
    sock.read_exact(&mut head).await.unwrap();
    let h = kvtier_proto::wire::Header::decode(&head).unwrap();
    assert_eq!(h.kind, kvtier_proto::wire::Kind::Error);
    let mut meta = vec![0u8; h.meta_len as usize];
    sock.read_exact(&mut meta).await.unwrap();
    let e: pb::WireError = prost::Message::decode(&meta[..]).unwrap();
    assert_eq!(e.code, Code::Unauthenticated as i32, "{e:?}");
    let mut rest = Vec::new();
    assert_eq!(sock.read_to_end(&mut rest).await.unwrap(), 0, "closed");
}

#[tokio::test]
async fn kvstore_tenants_follow_the_same_rules() {
    let (s, _dir) = server().await;
    let ch = tonic::transport::Endpoint::from_shared(common::raw_endpoint(&s))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let with = |token: &'static str| {
        move |mut r: tonic::Request<()>| {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            Ok(r)
        }
    };
    let mut b = KvStoreServiceClient::with_interceptor(ch.clone(), with(B));
    let mut a = KvStoreServiceClient::with_interceptor(ch.clone(), with(A));
    let lookup = |resource: &str| kpb::LookupRequest {
        resource_name: resource.into(),
        container_name: "kv".into(),
        ..Default::default()
    };
    // b's token covers kvstore:acct-b/; a's does not.
    let ok = b.lookup(lookup("acct-b")).await.unwrap().into_inner();
    assert!(ok.success, "{ok:?}");
    let st = a.lookup(lookup("acct-b")).await.unwrap_err();
    assert_eq!(st.code(), Code::PermissionDenied);
    let st = b.lookup(lookup("acct-a")).await.unwrap_err();
    assert_eq!(st.code(), Code::PermissionDenied);
    // Write, Read and StreamingRead follow the same rules.
    let write = |resource: &str| kpb::WriteRequest {
        resource_name: resource.into(),
        container_name: "kv".into(),
        chunk: Some(kpb::PromptChunk {
            hash: 42,
            buffer: vec![5u8; 1000].into(),
            tokens: (0..128).collect(),
            ..Default::default()
        }),
    };
    assert_eq!(
        a.write(write("acct-b")).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let wrote = b.write(write("acct-b")).await.unwrap().into_inner();
    assert!(wrote.success, "{wrote:?}");
    let location = b.lookup(kpb::LookupRequest {
        tokens: (0..128).collect(),
        precomputed_hashes: vec![42],
        ..lookup("acct-b")
    });
    let found = location.await.unwrap().into_inner();
    assert_eq!(found.cached_blocks, 1, "{found:?}");
    let location = found.locations[0].location.clone();
    let read = |resource: &str| kpb::ReadRequest {
        resource_name: resource.into(),
        container_name: "kv".into(),
        location: location.clone(),
        ..Default::default()
    };
    assert_eq!(
        a.read(read("acct-b")).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let got = b.read(read("acct-b")).await.unwrap().into_inner();
    assert!(got.found && got.chunk.unwrap().buffer.len() == 1000);
    let mut stream = a
        .streaming_read(tokio_stream::iter([read("acct-b")]))
        .await
        .unwrap()
        .into_inner();
    let st = stream.message().await.unwrap_err();
    assert_eq!(st.code(), Code::PermissionDenied);
    let mut none = KvStoreServiceClient::new(ch);
    assert_eq!(
        none.lookup(lookup("acct-b")).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert_eq!(
        none.write(write("acct-b")).await.unwrap_err().code(),
        Code::Unauthenticated
    );
}

#[tokio::test]
async fn http_answers_401_and_403_before_reading_the_body() {
    let (s, _dir) = server().await;
    let base = format!("http://{}", s.http_addr.unwrap());
    let http = reqwest::Client::new();
    let put = |ns: &str, token: Option<&str>| {
        let mut r = http
            .put(format!("{base}/v1/kv/{ns}/k1"))
            .body(vec![1u8; 10_000]);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let r = put("a%2Fx", None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "unauthenticated");
    assert_eq!(put("a%2Fx", Some(B)).await.unwrap().status(), 403);
    assert_eq!(put("a%2Fx", Some(RO)).await.unwrap().status(), 403);
    assert_eq!(put("a%2Fx", Some(A)).await.unwrap().status(), 204);
    let get = http
        .get(format!("{base}/v1/kv/a%2Fx/k1"))
        .bearer_auth(RO)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.bytes().await.unwrap().len(), 10_000);
    // Reads and deletes are checked the same way: another tenant's token
    // can neither read nor delete, a read-only one cannot delete.
    let call = |method: reqwest::Method, token: Option<&str>| {
        let mut r = http.request(method, format!("{base}/v1/kv/a%2Fx/k1"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    for (method, token, want) in [
        (reqwest::Method::GET, None, 401),
        (reqwest::Method::GET, Some(B), 403),
        (reqwest::Method::DELETE, None, 401),
        (reqwest::Method::DELETE, Some(B), 403),
        (reqwest::Method::DELETE, Some(RO), 403),
    ] {
        let got = call(method.clone(), token).await.unwrap().status();
        assert_eq!(got, want, "{method} with {token:?}");
    }
    // Still there, then deleted by its owner.
    assert_eq!(
        call(reqwest::Method::GET, Some(A)).await.unwrap().status(),
        200
    );
    let del = call(reqwest::Method::DELETE, Some(A))
        .await
        .unwrap()
        .status();
    assert!(del.is_success(), "{del}");
    assert_eq!(
        call(reqwest::Method::GET, Some(A)).await.unwrap().status(),
        404
    );
    // /metrics and /healthz are public by default.
    assert_eq!(
        http.get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn private_metrics_and_health_need_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, TOKENS).unwrap();
    let mut cfg = common::test_config();
    cfg.auth.tokens_file = path.to_string_lossy().into();
    cfg.auth.public_metrics = false;
    cfg.auth.public_health = false;
    let s = Server::start(cfg).await.unwrap();
    let base = format!("http://{}", s.http_addr.unwrap());
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        http.get(format!("{base}/metrics"))
            .bearer_auth(B)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let ch = tonic::transport::Endpoint::from_shared(common::raw_endpoint(&s))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let st = h
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn beyond_loopback_needs_tokens_or_insecure() {
    let mut cfg = common::test_config();
    cfg.server.listen = vec!["0.0.0.0:0".into()];
    let e = Server::start(cfg.clone()).await.err().expect("refused");
    assert!(e.to_string().contains("refusing to listen"), "{e}");
    assert!(e.to_string().contains("--auth-tokens"), "{e}");
    cfg.auth.insecure = true;
    let s = Server::start(cfg).await.expect("--insecure starts it");
    drop(s);
}
