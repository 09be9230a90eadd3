//! kvtier.v1 over real gRPC on loopback: round trips, prefix lookups, bad input.
mod common;

use bytes::Bytes;
use kvtier_client::{Tier, WriteBlock};
use kvtier_core::{HashFn, Key};
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use std::time::Duration;
use tonic::Code;

fn payloads(n: usize, size: usize, seed: u8) -> Vec<Bytes> {
    (0..n)
        .map(|i| {
            Bytes::from(
                (0..size)
                    .map(|j| (j as u8).wrapping_mul(31) ^ seed ^ i as u8)
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
}

#[tokio::test]
async fn write_lookup_read_roundtrip_byte_identical() {
    let (server, c) = common::start(common::test_config()).await;
    let tokens: Vec<u32> = (0..128 * 4 + 50).collect(); // 4 full blocks + a partial one
    let data = payloads(3, 1_200_000, 7);
    let w = c
        .write_tokens("model-a", &tokens[..128 * 3], &data)
        .await
        .unwrap();
    assert_eq!((w.stored, w.existing), (3, 0));
    // Idempotent re-write.
    let w = c
        .write_tokens("model-a", &tokens[..128 * 3], &data)
        .await
        .unwrap();
    assert_eq!((w.stored, w.existing), (0, 3));
    // Longer prompt: 3 of its 4 full blocks are cached; the 50-token tail is ignored.
    let l = c.lookup_tokens("model-a", &tokens, None).await.unwrap();
    assert_eq!(l.found, 3);
    assert_eq!(l.keys.len(), 4);
    assert_eq!(l.tiers, vec![Tier::Memory; 3]);
    assert!(l.timing.total_us >= l.timing.service_us);
    // Server-side hashing of tokens gives the same answer and the same keys.
    let mut raw = KvTierClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();
    let r = raw
        .lookup(pb::LookupRequest {
            namespace: "model-a".into(),
            tokens: tokens.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.found_blocks, 3);
    assert_eq!(r.keys, l.keys.iter().map(Key::bytes).collect::<Vec<_>>());
    // Divergent prompt stops at the divergence.
    let mut other = tokens.clone();
    other[200] += 1;
    assert_eq!(
        c.lookup_tokens("model-a", &other, None)
            .await
            .unwrap()
            .found,
        1
    );
    // Read all four: three come back byte-identical in order, flagged partial (missing).
    let rd = c.read("model-a", &l.keys, 0).await.unwrap();
    assert_eq!(rd.blocks.len(), 3);
    for (i, b) in rd.blocks.iter().enumerate() {
        assert_eq!(b.index, i);
        assert_eq!(b.payload, data[i]);
        assert_eq!(b.key, l.keys[i]);
    }
    assert!(rd.partial);
    assert_eq!(rd.reason, "missing");
    // Another namespace sees nothing.
    assert_eq!(
        c.lookup_tokens("model-b", &tokens, None)
            .await
            .unwrap()
            .found,
        0
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn sha256_keys_and_block_size_from_request() {
    let (server, _c) = common::start(common::test_config()).await;
    let mut raw = KvTierClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();
    let tokens: Vec<u32> = (0..40).collect();
    let r = raw
        .lookup(pb::LookupRequest {
            namespace: "n".into(),
            tokens: tokens.clone(),
            block_size: 16,
            hash: "sha256-v1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let want = HashFn::Sha256V1.chain(&tokens, 16).unwrap();
    assert_eq!(r.keys, want.iter().map(Key::bytes).collect::<Vec<_>>());
    let err = raw
        .lookup(pb::LookupRequest {
            namespace: "n".into(),
            tokens,
            hash: "md5".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("md5"));
    server.shutdown().await.unwrap();
}

fn block(key: &[u8], payload: Bytes) -> pb::Block {
    pb::Block {
        key: Bytes::copy_from_slice(key),
        crc32c: crc32c::crc32c(&payload),
        payload,
        ..Default::default()
    }
}

#[tokio::test]
async fn bad_input_gets_clear_statuses() {
    let mut cfg = common::test_config();
    cfg.engine.max_block_size = kvtier_core::ByteSize(1 << 20);
    let (server, c) = common::start(cfg).await;
    let mut raw = KvTierClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();

    // Oversized payload: INVALID_ARGUMENT naming the limit.
    let big = Bytes::from(vec![1u8; (1 << 20) + 1]);
    let err = raw
        .write(pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![block(b"big", big)],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("1048576"), "{}", err.message());

    // Checksum mismatch in the second block: rejected, and nothing (not even the first) stored.
    let good = block(b"good", Bytes::from_static(b"fine"));
    let mut bad = block(b"bad", Bytes::from_static(b"payload"));
    bad.crc32c ^= 0xdead;
    let err = raw
        .write(pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![good, bad],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DataLoss);
    assert!(err.message().contains("checksum"), "{}", err.message());
    let l = c
        .lookup("n", &[Key::new(&b"good"[..]).unwrap()], None)
        .await
        .unwrap();
    assert_eq!(l.found, 0, "nothing stored after a checksum failure");

    // Empty / over-long / malformed namespace and key.
    for ns in ["", &"x".repeat(200), "bad ns"] {
        let err = raw
            .write(pb::WriteRequest {
                namespace: ns.into(),
                blocks: vec![block(b"k", Bytes::from_static(b"v"))],
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "namespace {ns:?}");
        assert!(err.message().contains("namespace"), "{}", err.message());
    }
    for key in [vec![], vec![7u8; 600]] {
        let err = raw
            .write(pb::WriteRequest {
                namespace: "n".into(),
                blocks: vec![block(&key, Bytes::from_static(b"v"))],
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("key"), "{}", err.message());
    }
    let err = raw
        .read(pb::ReadRequest {
            namespace: "n".into(),
            keys: vec![Bytes::new()],
            lease_id: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // Keys and tokens together are ambiguous.
    let err = raw
        .lookup(pb::LookupRequest {
            namespace: "n".into(),
            keys: vec![Bytes::from_static(b"k")],
            tokens: vec![1],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // Fewer tokens than a block: zero full blocks, nothing found, not an error.
    let r = raw
        .lookup(pb::LookupRequest {
            namespace: "n".into(),
            tokens: vec![1, 2, 3],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.found_blocks, r.keys.len()), (0, 0));

    // Lease on a missing key: NOT_FOUND naming it.
    let err = raw
        .lease(pb::LeaseRequest {
            namespace: "n".into(),
            keys: vec![Bytes::from_static(b"missing")],
            lease_ms: 1000,
            release_lease_id: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("missing"), "{}", err.message());

    // Unknown lease on Read: FAILED_PRECONDITION.
    let err = raw
        .read(pb::ReadRequest {
            namespace: "n".into(),
            keys: vec![Bytes::from_static(b"k")],
            lease_id: 424242,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn another_namespaces_lease_reads_as_unknown() {
    let (server, c) = common::start(common::test_config()).await;
    let tokens: Vec<u32> = (0..256).collect();
    c.write_tokens("n", &tokens, &payloads(2, 1000, 1))
        .await
        .unwrap();
    let l = c.lookup_tokens("n", &tokens, Some(10_000)).await.unwrap();
    assert_ne!(l.lease_id, 0);
    let unknown = |e: kvtier_client::ClientError| {
        assert_eq!(e.code(), Some(Code::FailedPrecondition));
        e.to_string()
            .split("lease ")
            .nth(1)
            .map(|t| t.split_once(' ').map(|(_, rest)| rest.to_owned()))
    };
    // Named in namespace "m": the same answer as a lease never granted.
    let other = unknown(c.read("m", &l.keys, l.lease_id).await.unwrap_err());
    let never = unknown(
        c.read("m", &l.keys, l.lease_id + 1_000_000)
            .await
            .unwrap_err(),
    );
    assert_eq!(other, never);
    assert!(format!("{other:?}").contains("unknown"), "{other:?}");
    // In its own namespace it holds.
    assert_eq!(
        c.read("n", &l.keys, l.lease_id).await.unwrap().blocks.len(),
        2
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn lease_from_lookup_expires_and_read_then_fails() {
    let mut cfg = common::test_config();
    cfg.engine.max_lease = Duration::from_millis(200);
    let (server, c) = common::start(cfg).await;
    let tokens: Vec<u32> = (0..256).collect();
    c.write_tokens("n", &tokens, &payloads(2, 1000, 1))
        .await
        .unwrap();
    // Asks for 10 s; clamped to the configured 200 ms maximum.
    let l = c.lookup_tokens("n", &tokens, Some(10_000)).await.unwrap();
    assert_eq!(l.found, 2);
    assert_ne!(l.lease_id, 0);
    let rd = c.read("n", &l.keys, l.lease_id).await.unwrap();
    assert_eq!(rd.blocks.len(), 2);
    // Wait (by probing, bounded) until the lease is reported expired.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let err = loop {
        match c.read("n", &l.keys, l.lease_id).await {
            Err(e) => break e,
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(_) => panic!("lease never expired"),
        }
    };
    assert_eq!(err.code(), Some(Code::FailedPrecondition));
    assert!(err.to_string().contains("lease"), "{err}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn write_stream_delete_stats_and_health() {
    let (server, c) = common::start(common::test_config()).await;
    let mut raw = KvTierClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();
    let msgs = (0..5u8).map(|i| pb::WriteRequest {
        namespace: "s".into(),
        blocks: vec![block(&[i + 1], Bytes::from(vec![i; 100_000]))],
    });
    let r = raw
        .write_stream(tokio_stream::iter(msgs))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.stored, 5);
    let keys: Vec<Key> = (1..=5u8).map(|i| Key::new(vec![i]).unwrap()).collect();
    assert_eq!(c.delete("s", &keys[..2]).await.unwrap(), 2);
    assert_eq!(c.delete("s", &keys[..2]).await.unwrap(), 0);
    let st = c.stats().await.unwrap();
    assert_eq!(st.tiers[0].blocks, 3);
    // Standard health service answers SERVING.
    let chan = tonic::transport::Endpoint::from_shared(common::raw_endpoint(&server))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(chan);
    let resp = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // Parent links are returned on read.
    let w = WriteBlock {
        token_ids: Vec::new(),
        key: Key::new(&b"child"[..]).unwrap(),
        parent: Some(keys[4].clone()),
        token_count: 4,
        payload: Bytes::from_static(b"c"),
        ttl_ms: 0,
    };
    c.write("s", &[w]).await.unwrap();
    let rd = c
        .read("s", &[Key::new(&b"child"[..]).unwrap()], 0)
        .await
        .unwrap();
    assert_eq!(rd.blocks[0].parent.as_ref(), Some(&keys[4]));
    server.shutdown().await.unwrap();
}

/// Standard tools (grpcurl, grpcui, Postman) discover the services through
/// server reflection: every service is listed and its descriptor resolves.
#[tokio::test]
async fn server_reflection_lists_and_describes_every_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let (server, _c) = common::start(common::test_config()).await;
    let channel = tonic::transport::Endpoint::from_shared(common::raw_endpoint(&server))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut refl = ServerReflectionClient::new(channel);
    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let reqs = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "kvtier.v1.KvTier".into(),
        )),
        ask(MessageRequest::FileContainingSymbol(
            "kvstore.KVStoreService".into(),
        )),
        ask(MessageRequest::FileContainingSymbol(
            "kvtier.v1.NoSuchService".into(),
        )),
    ];
    let mut answers = refl
        .server_reflection_info(tokio_stream::iter(reqs))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    let end = loop {
        match answers.message().await {
            Ok(Some(a)) => got.push(a.message_response.unwrap()),
            Ok(None) => break None,
            Err(status) => break Some(status),
        }
    };
    assert_eq!(got.len(), 3, "{got:?}");
    let MessageResponse::ListServicesResponse(list) = &got[0] else {
        panic!("not a service list: {:?}", got[0])
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "kvtier.v1.KvTier",
        "kvstore.KVStoreService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    for i in [1, 2] {
        let MessageResponse::FileDescriptorResponse(f) = &got[i] else {
            panic!("no descriptor: {:?}", got[i])
        };
        assert!(!f.file_descriptor_proto.is_empty());
    }
    // An unknown symbol ends the stream with NOT_FOUND (tonic-reflection's way).
    let status = end.expect("an unknown symbol must be an error");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
}

/// Requests naming more than `MAX_KEYS_PER_REQUEST` blocks (as keys, or as
/// tokens at the block size) are refused with INVALID_ARGUMENT naming the
/// limit, before any key is hashed or looked up; one at the limit is served.
#[tokio::test]
async fn requests_over_the_key_limit_are_refused() {
    let (server, _c) = common::start(common::test_config()).await;
    let mut raw = KvTierClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let max = kvtier_server::grpc::v1::MAX_KEYS_PER_REQUEST;
    let keys = |n: usize| {
        (0..n)
            .map(|i| (i as u64).to_le_bytes().to_vec().into())
            .collect::<Vec<_>>()
    };
    let refused = |s: tonic::Status| {
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(
            s.message().contains(&format!("the limit is {max}")),
            "{s:?}"
        );
    };
    let lookup = |keys, tokens| pb::LookupRequest {
        namespace: "n".into(),
        keys,
        tokens,
        block_size: 16,
        ..Default::default()
    };
    refused(raw.lookup(lookup(keys(max + 1), vec![])).await.unwrap_err());
    refused(
        raw.lookup(lookup(vec![], vec![7u32; 16 * (max + 1)]))
            .await
            .unwrap_err(),
    );
    // Beyond any request's token limit: refused before decoding.
    let over = kvtier_proto::bounded::MAX_TOKENS_PER_REQUEST + 1;
    let e = raw
        .lookup(lookup(vec![], vec![7u32; over]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("tokens in one request; the limit is"),
        "{e:?}"
    );
    let read = pb::ReadRequest {
        namespace: "n".into(),
        keys: keys(max + 1),
        lease_id: 0,
    };
    refused(raw.read(read).await.unwrap_err());
    // At the limit: served (nothing stored, so nothing found).
    let at = raw
        .lookup(lookup(keys(max), vec![]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(at.found_blocks, 0);
    server.shutdown().await.unwrap();
}
