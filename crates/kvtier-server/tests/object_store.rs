//! The object-store tier end to end, against real Azurite and MinIO started
//! by the test (loopback, ephemeral ports, temp dirs; see
//! `kvtier_object::testing`): two nodes sharing a container, a store outage,
//! a corrupted object, a frozen (slow) store.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::{ByteSize, Key, Namespace, Tier};
use kvtier_object::testing::Emulator;
use kvtier_object::{ObjectTier, ObjectTierConfig};
use kvtier_server::Server;
use kvtier_server::config::Config;
use std::time::{Duration, Instant};

const NS: &str = "tenant-a";

fn node(em: &Emulator, policy: &str, disk: Option<&std::path::Path>) -> Config {
    let mut cfg = common::test_config();
    cfg.engine.memory_capacity = ByteSize::mib(64);
    cfg.object_store.url = em.url("kvtier", "shared");
    cfg.object_store.options = em.options();
    cfg.object_store.write_policy = policy.into();
    cfg.object_store.timeout = Duration::from_secs(3);
    cfg.object_store.request_timeout = Duration::from_secs(2);
    cfg.object_store.connect_timeout = Duration::from_millis(500);
    cfg.object_store.max_retries = 2;
    cfg.object_store.negative_cache_ttl = Duration::from_millis(200);
    if let Some(d) = disk {
        cfg.disk.dir = d.display().to_string();
        cfg.disk.capacity = ByteSize::mib(256);
    }
    cfg
}

async fn client(server: &Server, timeout: Duration) -> Client {
    let mut cc = ClientConfig::new(format!("http://{}", server.grpc_addrs[0]));
    cc.connections = 1;
    cc.retries = 0;
    // gRPC: these tests are about the engine and its tiers, not the transport.
    cc.data_plane = false;
    cc.timeout = timeout;
    Client::connect(cc).await.expect("client connects")
}

/// A chain of `n` blocks of `size` bytes, distinct per `tag`.
fn chain(tag: u8, n: usize, size: usize) -> Vec<WriteBlock> {
    let mut out: Vec<WriteBlock> = Vec::new();
    for i in 0..n {
        let key = Key::new(Bytes::from(vec![tag, i as u8, 0x5a, 0xa5])).unwrap();
        let payload: Vec<u8> = (0..size)
            .map(|j| {
                (j as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(i as u32 * 7 + tag as u32) as u8
            })
            .collect();
        out.push(WriteBlock {
            token_ids: Vec::new(),
            key,
            parent: out.last().map(|p| p.key.clone()),
            token_count: 128,
            payload: Bytes::from(payload),
            ttl_ms: 0,
        });
    }
    out
}

fn keys(c: &[WriteBlock]) -> Vec<Key> {
    c.iter().map(|b| b.key.clone()).collect()
}

async fn start(em: &Emulator, policy: &str, disk: Option<&std::path::Path>) -> Server {
    Server::start(node(em, policy, disk))
        .await
        .expect("server starts")
}

async fn two_nodes(em: Emulator) {
    em.create_container("kvtier").unwrap();
    let a = start(&em, "write-back", None).await;
    let b = start(&em, "write-through", None).await;
    let (ca, cb) = (
        client(&a, Duration::from_secs(5)).await,
        client(&b, Duration::from_secs(5)).await,
    );
    let blocks = chain(1, 8, 300 << 10);
    ca.write(NS, &blocks).await.unwrap();
    assert!(
        a.engine.flush_object_uploads(Duration::from_secs(10)).await,
        "write-back drained"
    );
    // B has never seen these blocks: the lookup asks the store.
    let l = cb.lookup(NS, &keys(&blocks), None).await.unwrap();
    assert_eq!(l.found, blocks.len());
    let r = cb.read(NS, &keys(&blocks), 0).await.unwrap();
    assert_eq!(r.blocks.len(), blocks.len(), "{r:?}");
    for (got, want) in r.blocks.iter().zip(&blocks) {
        assert_eq!(got.payload, want.payload, "byte-identical through B");
        assert_eq!(got.parent, want.parent);
    }
    // Every block came from the store: read through it, or prefetched into
    // memory by the lookup (object_store.prefetch) and read from there.
    assert!(
        r.blocks.iter().all(|b| matches!(
            b.tier,
            kvtier_client::Tier::Object | kvtier_client::Tier::Memory
        )),
        "{:?}",
        r.blocks.iter().map(|b| b.tier).collect::<Vec<_>>()
    );
    assert!(b.engine.stats().object.unwrap().fetches >= blocks.len() as u64);
    // Promoted: the second read is from memory.
    let r2 = cb.read(NS, &keys(&blocks[..1]), 0).await.unwrap();
    assert_eq!(r2.blocks[0].tier, kvtier_client::Tier::Memory);
    // And the other way round, write-through on B.
    let more = chain(2, 3, 1000);
    cb.write(NS, &more).await.unwrap();
    let l = ca.lookup(NS, &keys(&more), None).await.unwrap();
    assert_eq!(l.found, 3);
    // A key nobody wrote: a miss, then served by the negative cache.
    let missing = chain(3, 1, 10);
    assert_eq!(ca.lookup(NS, &keys(&missing), None).await.unwrap().found, 0);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_an_azurite_container() {
    two_nodes(Emulator::azurite().expect("Azurite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_a_minio_bucket() {
    two_nodes(Emulator::minio().expect("MinIO")).await;
}

fn assert_unavailable(e: &kvtier_client::ClientError, what: &str, url: &str) {
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{what}: {e}");
    assert!(
        e.to_string().contains(url),
        "{what}: message names the store: {e}"
    );
}

async fn outage(mut em: Emulator) {
    em.create_container("kvtier").unwrap();
    let url = em.url("kvtier", "shared");
    let dir = tempfile::tempdir().unwrap();
    // A: write-back with a disk; W: write-through; C: memory-only reader.
    let a = start(&em, "write-back", Some(dir.path())).await;
    let w = start(&em, "write-through", None).await;
    let c = start(&em, "write-back", None).await;
    let deadline = Duration::from_millis(1500);
    let (ca, cw, cc) = (
        client(&a, deadline).await,
        client(&w, deadline).await,
        client(&c, deadline).await,
    );
    let before = chain(10, 6, 64 << 10);
    ca.write(NS, &before).await.unwrap();
    assert!(a.engine.flush_object_uploads(Duration::from_secs(10)).await);

    em.stop();
    // Blocks A holds locally keep being served.
    let r = ca.read(NS, &keys(&before), 0).await.unwrap();
    assert_eq!(r.blocks.len(), before.len());
    // A lookup that needs the store answers from local knowledge, in time.
    let t0 = Instant::now();
    let l = cc.lookup(NS, &keys(&before), None).await.unwrap();
    assert_eq!(l.found, 0);
    assert!(t0.elapsed() < deadline, "lookup took {:?}", t0.elapsed());
    // A read that needs the store fails in time, UNAVAILABLE, naming it.
    let t0 = Instant::now();
    let e = cc.read(NS, &keys(&before[..1]), 0).await.unwrap_err();
    assert!(t0.elapsed() < deadline, "read took {:?}", t0.elapsed());
    assert_unavailable(&e, "read", &url);
    // Write-through fails clearly; write-back keeps accepting.
    let wt = chain(11, 1, 1000);
    let e = cw.write(NS, &wt).await.unwrap_err();
    assert_unavailable(&e, "write-through", &url);
    let during = chain(12, 20, 32 << 10);
    ca.write(NS, &during).await.unwrap();
    let depth = a.engine.stats().object.unwrap().queue_depth;
    assert!(depth > 0, "uploads wait while the store is down");
    let metrics = common::metrics(&a).await;
    assert!(
        metrics.contains("kvtier_object_writeback_queue_depth"),
        "{metrics}"
    );
    assert!(metrics.contains("kvtier_object_upload_lag_seconds"));

    em.restart().unwrap();
    assert!(
        a.engine.flush_object_uploads(Duration::from_secs(30)).await,
        "uploaded once the store is back"
    );
    // Every key, from a node that has never seen them.
    let fresh = start(&em, "write-back", None).await;
    let cf = client(&fresh, Duration::from_secs(10)).await;
    for set in [&before, &during] {
        let r = cf.read(NS, &keys(set), 0).await.unwrap();
        assert_eq!(r.blocks.len(), set.len(), "none lost: {r:?}");
        for (got, want) in r.blocks.iter().zip(set.iter()) {
            assert_eq!(got.payload, want.payload);
        }
    }
    assert_eq!(
        cf.lookup(NS, &keys(&wt), None).await.unwrap().found,
        0,
        "the failed write-through left nothing"
    );
    for s in [a, w, c, fresh] {
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azurite_outage_hurts_nobody() {
    outage(Emulator::azurite().expect("Azurite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minio_outage_hurts_nobody() {
    outage(Emulator::minio().expect("MinIO")).await;
}

async fn corruption(em: Emulator) {
    em.create_container("kvtier").unwrap();
    let a = start(&em, "write-through", None).await;
    let b = start(&em, "write-through", None).await;
    let (ca, cb) = (
        client(&a, Duration::from_secs(5)).await,
        client(&b, Duration::from_secs(5)).await,
    );
    let blocks = chain(20, 2, 100 << 10);
    ca.write(NS, &blocks).await.unwrap();
    // Tamper with the second object directly in the store.
    let tier = ObjectTier::open(ObjectTierConfig {
        url: em.url("kvtier", "shared"),
        options: em.options(),
        ..Default::default()
    })
    .unwrap();
    let id = kvtier_core::BlockId::new(Namespace::new(NS).unwrap(), blocks[1].key.clone());
    let (store, path) = tier.locate(&id).unwrap();
    let mut raw = store
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let n = raw.len();
    raw[n - 100] ^= 0x10;
    store.put(&path, raw.into()).await.unwrap();
    assert!(tier.get(&id).await.unwrap().is_none());
    let r = cb.read(NS, &keys(&blocks), 0).await.unwrap();
    assert_eq!(r.blocks.len(), 1, "the corrupt block is not served");
    assert_eq!(r.blocks[0].payload, blocks[0].payload);
    assert_eq!(r.reason, "missing");
    let m = common::metrics(&b).await;
    assert!(m.contains("kvtier_object_corrupt_total 1"), "{m}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azurite_corrupted_object_is_not_served() {
    corruption(Emulator::azurite().expect("Azurite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minio_corrupted_object_is_not_served() {
    corruption(Emulator::minio().expect("MinIO")).await;
}

async fn frozen(em: Emulator) {
    em.create_container("kvtier").unwrap();
    let a = start(&em, "write-through", None).await;
    let b = start(&em, "write-back", None).await;
    let ca = client(&a, Duration::from_secs(5)).await;
    let blocks = chain(30, 4, 16 << 10);
    ca.write(NS, &blocks).await.unwrap();
    em.pause();
    let deadline = Duration::from_millis(800);
    let cb = client(&b, deadline).await;
    let t0 = Instant::now();
    let l = cb.lookup(NS, &keys(&blocks), None).await.unwrap();
    assert_eq!(
        l.found, 0,
        "nothing known locally and the store does not answer"
    );
    assert!(t0.elapsed() < deadline, "lookup took {:?}", t0.elapsed());
    let t0 = Instant::now();
    let e = cb.read(NS, &keys(&blocks[..1]), 0).await.unwrap_err();
    assert!(t0.elapsed() < deadline, "read took {:?}", t0.elapsed());
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
    assert!(e.to_string().contains("did not answer"), "{e}");
    let ca_short = client(&a, deadline).await;
    let t0 = Instant::now();
    let e = ca_short.write(NS, &chain(31, 1, 1000)).await.unwrap_err();
    assert!(
        t0.elapsed() < deadline,
        "write took {:?}: {e}",
        t0.elapsed()
    );
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
    em.resume();
    let cb = client(&b, Duration::from_secs(10)).await;
    let r = cb.read(NS, &keys(&blocks), 0).await.unwrap();
    assert_eq!(
        r.blocks.len(),
        blocks.len(),
        "served again once the store answers"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azurite_frozen_store_deadlines_honoured() {
    frozen(Emulator::azurite().expect("Azurite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minio_frozen_store_deadlines_honoured() {
    frozen(Emulator::minio().expect("MinIO")).await;
}

/// The value of an unlabelled metric.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// A chain of KV-like bf16 blocks (`kvtier_object::testing::kv_like_bf16`).
fn kv_chain(tag: u8, n: usize, values: usize) -> Vec<WriteBlock> {
    let mut out = chain(tag, n, 1);
    for (i, b) in out.iter_mut().enumerate() {
        b.payload = Bytes::from(kvtier_object::testing::kv_like_bf16(
            values,
            tag as u64 * 1000 + i as u64,
        ));
    }
    out
}

/// docs/object-store.md#compression end to end: node A stores `zstd-planes`
/// objects (and `fp8-e4m3` ones for a namespace opted in); node B, with
/// compression off, reads both back from the store (decoding does not
/// depend on the reader's settings); a damaged frame is a miss counted
/// corrupt.
async fn compressed(em: Emulator) {
    em.create_container("kvtier").unwrap();
    let mut cfg = node(&em, "write-through", None);
    cfg.object_store.compression = "zstd-planes".into();
    cfg.object_store.compression_namespaces = vec![kvtier_server::config::CompressionNamespace {
        namespace: "lossy/".into(),
        codec: "fp8-e4m3".into(),
        dtype: Some("bf16".into()),
    }];
    let a = Server::start(cfg).await.expect("server starts");
    let b = start(&em, "write-through", None).await;
    let (ca, cb) = (
        client(&a, Duration::from_secs(10)).await,
        client(&b, Duration::from_secs(10)).await,
    );
    let blocks = kv_chain(40, 4, 256 << 10);
    ca.write(NS, &blocks).await.unwrap();
    let lossy_ns = "lossy/m";
    let lossy = kv_chain(41, 2, 256 << 10);
    ca.write(lossy_ns, &lossy).await.unwrap();
    let m = common::metrics(&a).await;
    let (raw, stored) = (
        metric(&m, "kvtier_object_put_payload_bytes_total"),
        metric(&m, "kvtier_object_put_stored_bytes_total"),
    );
    assert_eq!(raw, 3 << 20, "{m}");
    // zstd-planes saves >10 % on this data (2 MiB), fp8 about half (1 MiB).
    assert!(
        stored < (2 << 20) * 9 / 10 + (512 << 10) + 20_000,
        "{raw} -> {stored}"
    );

    // The objects in the store are version 2 (compressed).
    let tier = ObjectTier::open(ObjectTierConfig {
        url: em.url("kvtier", "shared"),
        options: em.options(),
        ..Default::default()
    })
    .unwrap();
    let id = |ns: &str, k: &Key| kvtier_core::BlockId::new(Namespace::new(ns).unwrap(), k.clone());
    let (store, path) = tier.locate(&id(NS, &blocks[0].key)).unwrap();
    let obj = store.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(&obj[4..6], &2u16.to_le_bytes(), "record version 2");
    assert!(obj.len() < blocks[0].payload.len());

    // B reads A's compressed objects: lossless byte-identical, lossy close.
    let r = cb.read(NS, &keys(&blocks), 0).await.unwrap();
    assert_eq!(r.blocks.len(), blocks.len(), "{r:?}");
    for (got, want) in r.blocks.iter().zip(&blocks) {
        assert_eq!(got.payload, want.payload, "lossless through the store");
    }
    let r = cb.read(lossy_ns, &keys(&lossy), 0).await.unwrap();
    assert_eq!(r.blocks.len(), lossy.len(), "{r:?}");
    for (got, want) in r.blocks.iter().zip(&lossy) {
        assert_eq!(got.payload.len(), want.payload.len());
        assert_ne!(got.payload, want.payload, "fp8 is lossy");
        let f = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(2)
                .map(|p| f32::from_bits((u16::from_le_bytes([p[0], p[1]]) as u32) << 16))
                .collect()
        };
        let (x, y) = (f(&want.payload), f(&got.payload));
        let (se, sx) = x.iter().zip(&y).fold((0f64, 0f64), |(e, s), (a, q)| {
            (e + ((a - q) as f64).powi(2), s + (*a as f64).powi(2))
        });
        assert!(
            (se / sx).sqrt() < 0.05,
            "relative RMS error {}",
            (se / sx).sqrt()
        );
    }

    // A damaged frame (unknown codec id, frame checksum made right again):
    // a miss, counted corrupt, never served.
    let mut raw_obj = obj.to_vec();
    let h = kvtier_core::disk::format::decode_object_header(&raw_obj)
        .unwrap()
        .header_len;
    raw_obj[h] = 9;
    let sum = crc32c::crc32c_append(crc32c::crc32c(&raw_obj[h..h + 16]), &raw_obj[h + 20..]);
    raw_obj[h + 16..h + 20].copy_from_slice(&sum.to_le_bytes());
    store.put(&path, raw_obj.into()).await.unwrap();
    // C: a fresh node that has nothing of it in memory.
    let c = start(&em, "write-through", None).await;
    let cc = client(&c, Duration::from_secs(10)).await;
    let r = cc.read(NS, &keys(&blocks), 0).await.unwrap();
    assert_eq!(
        r.blocks.len(),
        0,
        "the first block is corrupt: nothing served"
    );
    assert_eq!(r.reason, "missing");
    let m = common::metrics(&c).await;
    assert_eq!(metric(&m, "kvtier_object_corrupt_total"), 1, "{m}");
    for s in [a, b, c] {
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azurite_compressed_objects_round_trip() {
    compressed(Emulator::azurite().expect("Azurite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minio_compressed_objects_round_trip() {
    compressed(Emulator::minio().expect("MinIO")).await;
}
