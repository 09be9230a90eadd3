//! Tenants stay apart on every path (docs/security.md, "Threats and their
//! guards"), each test playing the other tenant against a real server: an
//! exact grant `=kvstore:acme/c1` reaches container `c1` and not `c10` over
//! the kvstore protocol, kvtier.v1 gRPC, the data plane and HTTP; a bare
//! prefix grant (`acme`) is refused at load, and `acme/` or `=acme` do not
//! reach `acme2/x`; another tenant's lease answers exactly as one never
//! granted, and lease ids are not sequential; reflection needs a token.
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
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const C1: &str = "token-for-acme-c1-only-0001";
const ACME: &str = "token-for-acme-prefix-0002";
const EVIL: &str = "token-for-tenant-evil-0003";

const TOKENS: &str = r#"
[[tokens]]
token = "token-for-acme-c1-only-0001"
namespaces = ["=kvstore:acme/c1"]
access = "read-write"
name = "acme c1"

[[tokens]]
token = "token-for-acme-prefix-0002"
namespaces = ["acme/", "=acme"]
access = "read-write"
name = "acme"

[[tokens]]
token = "token-for-tenant-evil-0003"
namespaces = ["evil/"]
access = "read-write"
name = "evil"
"#;

/// Blocks of 4 MiB, the size engines write.
const BLOCK: usize = 4 << 20;

async fn server(tokens: &str) -> anyhow::Result<(Server, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, tokens).unwrap();
    let mut cfg = common::test_config();
    cfg.auth.tokens_file = path.to_string_lossy().into();
    Ok((Server::start(cfg).await?, dir))
}

async fn client(s: &Server, token: &str) -> Client {
    let mut c = ClientConfig::new(common::raw_endpoint(s));
    c.connections = 1;
    c.retries = 0;
    c.token = Some(token.into());
    let c = Client::connect(c).await.unwrap();
    assert!(
        c.data_plane().is_some(),
        "reads and writes take the data plane"
    );
    c
}

type Bearer =
    Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;

async fn channel(s: &Server) -> Channel {
    tonic::transport::Endpoint::from_shared(common::raw_endpoint(s))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn bearer(token: &'static str) -> Bearer {
    Box::new(move |mut r: tonic::Request<()>| {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        Ok(r)
    })
}

async fn v1(s: &Server, token: &'static str) -> KvTierClient<InterceptedService<Channel, Bearer>> {
    KvTierClient::with_interceptor(channel(s).await, bearer(token))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

fn blocks(n: usize, size: usize, seed: u8) -> (Vec<Key>, Vec<WriteBlock>) {
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
            payload: Bytes::from(vec![seed; size]),
            ttl_ms: 0,
        })
        .collect();
    (keys, wb)
}

fn code<T>(r: Result<T, kvtier_client::ClientError>) -> Option<Code> {
    r.err().and_then(|e| e.code())
}

/// kvtier.v1 over gRPC (not the data plane): every call on `ns` with
/// `keys` and `wb`, each answer's code (`Ok` as `Code::Ok`).
async fn v1_codes(
    c: &mut KvTierClient<InterceptedService<Channel, Bearer>>,
    ns: &str,
    keys: &[Key],
    wb: &[WriteBlock],
) -> Vec<Code> {
    let keys: Vec<Bytes> = keys.iter().map(Key::bytes).collect();
    let of = |r: Result<(), tonic::Status>| r.err().map_or(Code::Ok, |s| s.code());
    let lookup = pb::LookupRequest {
        namespace: ns.into(),
        keys: keys.clone(),
        lease_ms: 1000,
        ..Default::default()
    };
    let write = pb::WriteRequest {
        namespace: ns.into(),
        blocks: wb
            .iter()
            .map(|b| pb::Block {
                token_ids: Vec::new(),
                key: b.key.bytes(),
                parent_key: b.parent.as_ref().map_or_else(Bytes::new, Key::bytes),
                token_count: b.token_count,
                crc32c: crc32c::crc32c(&b.payload),
                payload: b.payload.clone(),
                ttl_ms: 0,
            })
            .collect(),
    };
    let read = pb::ReadRequest {
        namespace: ns.into(),
        keys: keys.clone(),
        lease_id: 0,
    };
    let delete = pb::DeleteRequest {
        namespace: ns.into(),
        keys: keys[..1].to_vec(),
    };
    let lease = pb::LeaseRequest {
        namespace: ns.into(),
        keys: keys.clone(),
        lease_ms: 1000,
        ..Default::default()
    };
    let read_code = match c.read(read).await {
        Ok(s) => {
            let mut s = s.into_inner();
            match s.message().await {
                Ok(_) => Code::Ok,
                Err(st) => st.code(),
            }
        }
        Err(st) => st.code(),
    };
    vec![
        of(c.write(write).await.map(drop)),
        of(c.lookup(lookup).await.map(drop)),
        read_code,
        of(c.lease(lease).await.map(drop)),
        of(c.delete(delete).await.map(drop)),
    ]
}

/// HTTP PUT, GET and DELETE of one 4 MiB value in `ns`: their statuses.
async fn http_codes(s: &Server, token: &str, ns: &str) -> Vec<u16> {
    let base = format!("http://{}/v1/kv", s.http_addr.unwrap());
    let url = format!("{base}/{}/k1", ns.replace(':', "%3A").replace('/', "%2F"));
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for m in [
        reqwest::Method::PUT,
        reqwest::Method::GET,
        reqwest::Method::DELETE,
    ] {
        let mut r = http.request(m.clone(), &url).bearer_auth(token);
        if m == reqwest::Method::PUT {
            r = r.body(vec![3u8; BLOCK]);
        }
        out.push(r.send().await.unwrap().status().as_u16());
    }
    out
}

#[tokio::test]
async fn an_exact_kvstore_grant_reaches_c1_and_never_c10() {
    let (s, _dir) = server(TOKENS).await.unwrap();
    let tenant = |r: &str, c: &str| (r.to_string(), c.to_string());
    let (own, other) = (tenant("acme", "c1"), tenant("acme", "c10"));

    // kvstore.KVStoreService: tenant (acme, c1) is the namespace kvstore:acme/c1.
    let mut kv = KvStoreServiceClient::with_interceptor(channel(&s).await, bearer(C1))
        .max_encoding_message_size(64 << 20)
        .max_decoding_message_size(64 << 20);
    let write = |(r, c): &(String, String)| kpb::WriteRequest {
        resource_name: r.clone(),
        container_name: c.clone(),
        chunk: Some(kpb::PromptChunk {
            hash: 42,
            buffer: vec![5u8; BLOCK].into(),
            tokens: (0..128).collect(),
            ..Default::default()
        }),
    };
    let lookup = |(r, c): &(String, String)| kpb::LookupRequest {
        resource_name: r.clone(),
        container_name: c.clone(),
        tokens: (0..128).collect(),
        precomputed_hashes: vec![42],
        ..Default::default()
    };
    assert!(kv.write(write(&own)).await.unwrap().into_inner().success);
    let found = kv.lookup(lookup(&own)).await.unwrap().into_inner();
    assert_eq!(found.cached_blocks, 1, "{found:?}");
    let location = found.locations[0].location.clone();
    let read = |(r, c): &(String, String)| kpb::ReadRequest {
        resource_name: r.clone(),
        container_name: c.clone(),
        location: location.clone(),
        ..Default::default()
    };
    assert!(kv.read(read(&own)).await.unwrap().into_inner().found);
    assert_eq!(
        kv.write(write(&other)).await.unwrap_err().code(),
        Code::PermissionDenied,
        "a c1 grant wrote into c10"
    );
    assert_eq!(
        kv.lookup(lookup(&other)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    assert_eq!(
        kv.read(read(&other)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let mut stream = kv
        .streaming_read(tokio_stream::iter([read(&other)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stream.message().await.unwrap_err().code(),
        Code::PermissionDenied
    );

    // kvtier.v1 over gRPC, naming the kvstore namespaces directly.
    let (keys, wb) = blocks(2, BLOCK, 9);
    let mut g = v1(&s, C1).await;
    assert_eq!(
        v1_codes(&mut g, "kvstore:acme/c1", &keys, &wb).await,
        [Code::Ok; 5]
    );
    for ns in ["kvstore:acme/c10", "kvstore:acme/c1/x", "kvstore:acme/c"] {
        assert_eq!(
            v1_codes(&mut g, ns, &keys, &wb).await,
            [Code::PermissionDenied; 5],
            "{ns}"
        );
    }

    // The data plane.
    let c = client(&s, C1).await;
    c.write("kvstore:acme/c1", &wb).await.unwrap();
    assert_eq!(
        code(c.write("kvstore:acme/c10", &wb).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(c.read("kvstore:acme/c10", &keys, 0).await),
        Some(Code::PermissionDenied)
    );

    // HTTP.
    assert_eq!(http_codes(&s, C1, "kvstore:acme/c1").await, [204, 200, 204]);
    assert_eq!(
        http_codes(&s, C1, "kvstore:acme/c10").await,
        [403, 403, 403]
    );
}

#[tokio::test]
async fn a_bare_prefix_grant_is_refused_and_acme_never_reaches_acme2() {
    // `acme` used to cover `acme2/...` too: a tokens file with it is
    // refused at start, naming both ways to say what was meant.
    let bare = TOKENS.replace("[\"acme/\", \"=acme\"]", "[\"acme\"]");
    let e = server(&bare).await.err().expect("refused").to_string();
    for want in ["namespaces[0]", "ambiguous", "\"acme/\"", "\"=acme\""] {
        assert!(e.contains(want), "{want}: {e}");
    }

    // `acme/` and `=acme` cover acme/x and acme, and never acme2/x.
    let (s, _dir) = server(TOKENS).await.unwrap();
    let (keys, wb) = blocks(2, BLOCK, 4);
    let mut g = v1(&s, ACME).await;
    for ns in ["acme/x", "acme"] {
        assert_eq!(
            v1_codes(&mut g, ns, &keys, &wb).await,
            [Code::Ok; 5],
            "{ns}"
        );
    }
    for ns in ["acme2/x", "acme2", "acme-x"] {
        assert_eq!(
            v1_codes(&mut g, ns, &keys, &wb).await,
            [Code::PermissionDenied; 5],
            "{ns}"
        );
    }
    let c = client(&s, ACME).await;
    c.write("acme", &wb).await.unwrap();
    assert_eq!(
        code(c.write("acme2/x", &wb).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(c.read("acme2/x", &keys, 0).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(http_codes(&s, ACME, "acme").await, [204, 200, 204]);
    assert_eq!(http_codes(&s, ACME, "acme2/x").await, [403, 403, 403]);
}

/// The kvtier_auth_denied_total{reason="permission_denied"} counter.
async fn denied(s: &Server) -> f64 {
    let m = common::metrics(s).await;
    m.lines()
        .find_map(|l| l.strip_prefix("kvtier_auth_denied_total{reason=\"permission_denied\"} "))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn another_tenants_lease_answers_as_one_never_granted() {
    let (s, _dir) = server(TOKENS).await.unwrap();
    let ns = "acme/secret-project-x";
    let acme = client(&s, ACME).await;
    let (keys, wb) = blocks(2, 1000, 1);
    acme.write(ns, &wb).await.unwrap();
    // 16 leases: their ids are neither sequential nor close to each other.
    let mut ids = Vec::new();
    for _ in 0..16 {
        let l = acme.lookup(ns, &keys, Some(60_000)).await.unwrap();
        assert_eq!(l.found, 2);
        ids.push(l.lease_id);
    }
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            assert!(
                a.abs_diff(*b) > 1 << 32,
                "lease ids {a} and {b} are guessable: {ids:?}"
            );
        }
    }
    let id = ids[0];
    let never = ids.iter().max().unwrap() + 1;

    // Releasing: the same code and words for acme's lease as for none.
    let mut evil = v1(&s, EVIL).await;
    let release = |lease: u64| pb::LeaseRequest {
        release_lease_id: lease,
        ..Default::default()
    };
    let before = denied(&s).await;
    let foreign = evil.lease(release(id)).await.unwrap_err();
    assert_eq!(
        denied(&s).await,
        before,
        "a refusal counted in /metrics tells the lease exists"
    );
    let unknown = evil.lease(release(never)).await.unwrap_err();
    assert_eq!(foreign.code(), Code::NotFound, "{foreign:?}");
    assert_eq!(foreign.code(), unknown.code());
    assert_eq!(
        foreign.message().replace(&id.to_string(), "ID"),
        unknown.message().replace(&never.to_string(), "ID")
    );
    assert!(!foreign.message().contains(ns), "{foreign:?}");

    // Reading under it, in evil's own namespace, over gRPC and the data
    // plane: the same answer as a lease never granted.
    let evil_read = |lease: u64| pb::ReadRequest {
        namespace: "evil/x".into(),
        keys: keys.iter().map(Key::bytes).collect(),
        lease_id: lease,
    };
    let a = evil.read(evil_read(id)).await.unwrap_err();
    let b = evil.read(evil_read(never)).await.unwrap_err();
    assert_eq!(
        (a.code(), b.code()),
        (Code::FailedPrecondition, Code::FailedPrecondition)
    );
    assert_eq!(
        a.message().replace(&id.to_string(), "ID"),
        b.message().replace(&never.to_string(), "ID")
    );
    let evil_dp = client(&s, EVIL).await;
    let a = evil_dp.read("evil/x", &keys, id).await.unwrap_err();
    let b = evil_dp.read("evil/x", &keys, never).await.unwrap_err();
    assert_eq!(a.code(), b.code());
    assert_eq!(
        a.to_string().replace(&id.to_string(), "ID"),
        b.to_string().replace(&never.to_string(), "ID")
    );

    // The lease is still acme's: it reads under it and releases it.
    assert_eq!(acme.read(ns, &keys, id).await.unwrap().blocks.len(), 2);
    acme.release_lease(id).await.unwrap();
    assert_eq!(code(acme.release_lease(id).await), Some(Code::NotFound));
}

#[tokio::test]
async fn reflection_needs_a_token_when_tokens_are_on() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as Alpha;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as AlphaRequest;

    let (s, _dir) = server(TOKENS).await.unwrap();
    let list = || {
        tokio_stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }])
    };
    let st = ServerReflectionClient::new(channel(&s).await)
        .server_reflection_info(list())
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated, "{st:?}");
    let st = Alpha::new(channel(&s).await)
        .server_reflection_info(tokio_stream::iter([
            tonic_reflection::pb::v1alpha::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(AlphaRequest::ListServices(String::new())),
            },
        ]))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated, "v1alpha: {st:?}");
    // Any known token may ask (it names no namespace).
    let mut ok = ServerReflectionClient::with_interceptor(channel(&s).await, bearer(EVIL))
        .server_reflection_info(list())
        .await
        .unwrap()
        .into_inner();
    assert!(ok.message().await.unwrap().is_some());
}
