//! The seed service's wire API (kvstore.KVStoreService) over real gRPC.
mod common;

use bytes::Bytes;
use kvtier_client::ClientConfig;
use kvtier_client::kvstore::{KvStoreClient, chunk_hashes, chunks};
use kvtier_proto::kvstore as pb;
use kvtier_proto::kvstore::kv_store_service_client::KvStoreServiceClient;

fn payload(i: usize, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|j| (j as u8) ^ (i as u8).wrapping_mul(41))
            .collect::<Vec<u8>>(),
    )
}

fn prompt(n_tokens: usize, salt: i64) -> Vec<i64> {
    (0..n_tokens as i64).map(|t| t * 31 + salt).collect()
}

async fn client(server: &kvtier_server::Server, resource: &str, container: &str) -> KvStoreClient {
    KvStoreClient::connect(
        ClientConfig::new(common::raw_endpoint(server)),
        resource,
        container,
    )
    .await
    .unwrap()
}

fn check_metrics(m: &Option<pb::ServerMetrics>) {
    let m = m.as_ref().expect("server_metrics present");
    assert!(
        m.storage_latency_us >= 0 && m.storage_latency_us <= m.total_latency_us,
        "{m:?}"
    );
    assert_eq!(m.overhead_us, m.total_latency_us - m.storage_latency_us);
}

#[tokio::test]
async fn conversation_lookup_read_versions_and_streaming() {
    let (server, _) = common::start(common::test_config()).await;
    let c = client(&server, "acct1", "kv").await;
    let toks = prompt(128 * 3, 5);
    let data: Vec<Bytes> = (0..3).map(|i| payload(i, 1_200_000)).collect();
    for ch in chunks(&toks, 128, &data, "p1") {
        check_metrics(&c.write(ch).await.unwrap().server_metrics);
    }
    let hashes = chunk_hashes(&toks, 128);

    // Longer prompt: 3 cached, last_hash right, locations readable byte-identical.
    let mut longer = toks.clone();
    longer.extend(prompt(200, 999));
    let l = c.lookup(&longer).await.unwrap();
    assert_eq!(l.cached_blocks, 3);
    assert_eq!(l.last_hash, hashes[2]);
    assert_eq!(
        l.locations.iter().map(|x| x.hash).collect::<Vec<_>>(),
        hashes
    );
    check_metrics(&l.server_metrics);
    for (i, loc) in l.locations.iter().enumerate() {
        let r = c.read(&loc.location).await.unwrap();
        assert!(r.found && r.success, "{r:?}");
        let ch = r.chunk.unwrap();
        assert_eq!(ch.buffer, data[i]);
        assert_eq!(ch.hash, hashes[i]);
        assert_eq!(ch.parent_hash, if i == 0 { 0 } else { hashes[i - 1] });
        assert_eq!(ch.tokens, toks[i * 128..(i + 1) * 128]);
        assert_eq!(ch.partition_key, "p1");
        check_metrics(&r.server_metrics);
    }

    // Divergent prompt: stops at the divergence.
    let mut div = toks.clone();
    div[128 + 7] = -1;
    assert_eq!(c.lookup(&div).await.unwrap().cached_blocks, 1);

    // Colliding block: same 128 tokens as block 2 after a different block 1.
    let mut alt = toks.clone();
    for t in &mut alt[128..256] {
        *t += 100_000;
    }
    let alt_hashes = chunk_hashes(&alt, 128);
    assert_ne!(alt_hashes[2], hashes[2]);
    let alt_data: Vec<Bytes> = (10..13).map(|i| payload(i, 4096)).collect();
    for ch in chunks(&alt, 128, &alt_data, "p2").into_iter().skip(1) {
        c.write(ch).await.unwrap();
    }
    let la = c.lookup(&alt).await.unwrap();
    assert_eq!(la.cached_blocks, 3);
    assert_eq!(la.last_hash, alt_hashes[2]);
    let lo = c.lookup(&toks).await.unwrap();
    assert_eq!(lo.last_hash, hashes[2], "original version still resolvable");
    let v_alt = c
        .read(&la.locations[2].location)
        .await
        .unwrap()
        .chunk
        .unwrap();
    let v_orig = c
        .read(&lo.locations[2].location)
        .await
        .unwrap()
        .chunk
        .unwrap();
    assert_eq!(v_alt.buffer, alt_data[2]);
    assert_eq!(v_orig.buffer, data[2]);
    assert_eq!(v_alt.tokens, v_orig.tokens, "same tokens, two versions");

    // StreamingRead of all locations, in order, plus an unknown one.
    let mut locs: Vec<String> = l.locations.iter().map(|x| x.location.clone()).collect();
    locs.push("44".repeat(25));
    let rs = c.streaming_read(&locs).await.unwrap();
    assert_eq!(rs.len(), 4);
    for i in 0..3 {
        assert_eq!(rs[i].chunk.as_ref().unwrap().buffer, data[i]);
    }
    assert!(!rs[3].found && !rs[3].success);
    assert!(rs[3].error.contains("not found"), "{}", rs[3].error);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn tenants_are_isolated_and_strict_mode_refuses_unknown() {
    let mut cfg = common::test_config();
    cfg.kvstore
        .tenants
        .push(kvtier_server::config::TenantMapping {
            resource_name: "known".into(),
            container_name: "c".into(),
            namespace: "tenant-known".into(),
            object_store: None,
        });
    let (server, _) = common::start(cfg.clone()).await;
    let a = client(&server, "acct-a", "kv").await;
    let b = client(&server, "acct-b", "kv").await;
    let toks = prompt(128 * 2, 1);
    for ch in chunks(&toks, 128, &[payload(1, 100), payload(2, 100)], "") {
        a.write(ch).await.unwrap();
    }
    assert_eq!(a.lookup(&toks).await.unwrap().cached_blocks, 2);
    assert_eq!(
        b.lookup(&toks).await.unwrap().cached_blocks,
        0,
        "identical tokens, other tenant"
    );
    // B cannot read A's location either.
    let loc = a.lookup(&toks).await.unwrap().locations[0].location.clone();
    assert!(!b.read(&loc).await.unwrap().found);
    // The mapped tenant lands in its configured namespace.
    let k = client(&server, "known", "c").await;
    for ch in chunks(&toks, 128, &[payload(1, 10), payload(2, 10)], "") {
        k.write(ch).await.unwrap();
    }
    let stats = common::client_for(&server).await.stats().await.unwrap();
    assert!(stats.tiers[0].blocks >= 12);
    server.shutdown().await.unwrap();

    cfg.kvstore.strict_tenants = true;
    let (server, _) = common::start(cfg).await;
    let mut raw = KvStoreServiceClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();
    let r = raw
        .lookup(pb::LookupRequest {
            resource_name: "stranger".into(),
            container_name: "x".into(),
            tokens: toks.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.success);
    assert!(r.error.contains("unknown tenant"), "{}", r.error);
    let r = raw
        .lookup(pb::LookupRequest {
            resource_name: "known".into(),
            container_name: "c".into(),
            tokens: toks,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.success, "{}", r.error);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_requests_get_in_band_errors() {
    let mut cfg = common::test_config();
    cfg.engine.max_block_size = kvtier_core::ByteSize(1 << 20);
    let (server, _) = common::start(cfg).await;
    let mut raw = KvStoreServiceClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();
    let w = |chunk: Option<pb::PromptChunk>| pb::WriteRequest {
        resource_name: "r".into(),
        container_name: "c".into(),
        chunk,
    };
    // No chunk.
    let r = raw.write(w(None)).await.unwrap().into_inner();
    assert!(!r.success && r.error.contains("no chunk"), "{}", r.error);
    // Wrong token count.
    let bad = pb::PromptChunk {
        tokens: vec![1; 100],
        buffer: Bytes::from_static(b"x"),
        ..Default::default()
    };
    let r = raw.write(w(Some(bad))).await.unwrap().into_inner();
    assert!(!r.success && r.error.contains("128"), "{}", r.error);
    check_metrics(&r.server_metrics);
    // Oversized buffer.
    let big = pb::PromptChunk {
        tokens: vec![1; 128],
        buffer: Bytes::from(vec![0u8; (1 << 20) + 1]),
        ..Default::default()
    };
    let r = raw.write(w(Some(big))).await.unwrap().into_inner();
    assert!(
        !r.success && r.error.contains("maximum block size"),
        "{}",
        r.error
    );
    // Malformed locations.
    for loc in ["", "zz", "not-hex-at-all", &"ab".repeat(25)] {
        let r = raw
            .read(pb::ReadRequest {
                resource_name: "r".into(),
                container_name: "c".into(),
                location: loc.into(),
                completion_id: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!r.found && !r.success, "location {loc:?}");
        assert!(!r.error.is_empty());
    }
    // Fewer tokens than a block: zero cached, success.
    let r = raw
        .lookup(pb::LookupRequest {
            resource_name: "r".into(),
            container_name: "c".into(),
            tokens: vec![1, 2, 3],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.success);
    assert_eq!(r.cached_blocks, 0);
    // precomputed_hashes shorter than the number of blocks: clear error.
    let r = raw
        .lookup(pb::LookupRequest {
            resource_name: "r".into(),
            container_name: "c".into(),
            tokens: vec![1; 256],
            precomputed_hashes: vec![1],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !r.success && r.error.contains("precomputed_hashes"),
        "{}",
        r.error
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn conversation_turns_hit_the_growing_prefix() {
    let (server, _) = common::start(common::test_config()).await;
    let c = client(&server, "play", "ground").await;
    let mut conv = kvtier_client::conversation::Conversation::new(128);
    let t1 = conv
        .turn(&c, &prompt(300, 1), |i, _| payload(i, 1000))
        .await
        .unwrap();
    assert_eq!(
        (t1.blocks, t1.hits, t1.misses, t1.writes.len()),
        (2, 0, 2, 2)
    );
    let t2 = conv
        .turn(&c, &prompt(300, 2), |i, _| payload(i, 1000))
        .await
        .unwrap();
    assert_eq!((t2.blocks, t2.hits, t2.misses), (4, 2, 2));
    assert_eq!(t2.reads.len(), 2);
    assert_eq!(t2.bytes_read, 2000);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn lookups_over_the_block_limit_are_refused() {
    // As kvtier.v1 refuses more than 65,536 keys: before any block is looked up.
    let mut cfg = common::test_config();
    cfg.kvstore.block_size = 2;
    let (server, _) = common::start(cfg).await;
    let mut raw = KvStoreServiceClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap()
        .max_encoding_message_size(256 << 20);
    let max = kvtier_server::grpc::v1::MAX_KEYS_PER_REQUEST;
    let lookup = |tokens: usize, hashes: usize| pb::LookupRequest {
        resource_name: "r".into(),
        container_name: "c".into(),
        tokens: vec![5; tokens],
        precomputed_hashes: vec![9; hashes],
        ..Default::default()
    };
    // More blocks of tokens than the limit: an in-band error, as the seed
    // service answers.
    let r = raw
        .lookup(lookup(2 * (max + 1), 0))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !r.success && r.error.contains(&format!("the limit is {max}")),
        "{}",
        r.error
    );
    // Lists longer than any request may carry are refused before decoding:
    // INVALID_ARGUMENT (kvtier_proto::bounded).
    let tokens = kvtier_proto::bounded::MAX_TOKENS_PER_REQUEST;
    for (tokens, hashes, what) in [
        (4, max + 1, "precomputed_hashes"),
        (tokens + 1, 0, "tokens"),
    ] {
        let e = raw.lookup(lookup(tokens, hashes)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(what) && e.message().contains("the limit is"),
            "{e:?}"
        );
    }
    // At the limit: answered (nothing stored, so nothing cached).
    let r = raw.lookup(lookup(2 * max, max)).await.unwrap().into_inner();
    assert!(r.success, "{}", r.error);
    assert_eq!(r.cached_blocks, 0);
    server.shutdown().await.unwrap();
}
