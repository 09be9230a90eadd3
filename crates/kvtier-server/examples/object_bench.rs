//! Object-store tier latency: 1.2 MB reads cold (object store) vs warm (disk)
//! vs hot (memory) at several concurrencies, lookups of a 64-block chain fully
//! local vs needing the store, and the emulator's own put/get latency via
//! `object_store` in the same run as the floor. Against a real Azurite
//! started here. Writes JSON to the path given as the first argument.
//!
//! Run: `scripts/bench-object-store.sh` (release build).
use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::{ByteSize, Key};
use kvtier_object::testing::Emulator;
use kvtier_server::Server;
use kvtier_server::config::Config;
use serde_json::json;
use std::time::{Duration, Instant};

const NS: &str = "bench";
const SIZE: usize = 1_258_291;
const BLOCKS: usize = 64;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn median(mut v: Vec<f64>) -> f64 {
    pct(&mut v, 0.5)
}

fn node_cfg(em: &Emulator, disk: &std::path::Path) -> Config {
    let mut cfg = Config::default();
    cfg.server.listen = vec!["127.0.0.1:0".into()];
    cfg.server.http_listen = String::new();
    cfg.engine.memory_capacity = ByteSize::gib(1);
    cfg.disk.dir = disk.display().to_string();
    cfg.disk.capacity = ByteSize::gib(2);
    cfg.disk.sync = kvtier_core::SyncMode::Batch;
    cfg.object_store.url = em.url("kvtier", "bench");
    cfg.object_store.options = em.options();
    cfg.object_store.write_policy = "write-through".into();
    // Every lookup asks the store (no existence cache) so the numbers are the store's.
    cfg.object_store.positive_cache_ttl = Duration::ZERO;
    cfg.object_store.negative_cache_ttl = Duration::ZERO;
    cfg
}

async fn client(s: &Server, conns: usize) -> Client {
    let mut cc = ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    cc.connections = conns;
    cc.data_plane = false;
    cc.timeout = Duration::from_secs(30);
    Client::connect(cc).await.unwrap()
}

fn chain() -> Vec<WriteBlock> {
    let mut out: Vec<WriteBlock> = Vec::new();
    for i in 0..BLOCKS {
        let key = Key::new(Bytes::from(format!("bench-block-{i:04}").into_bytes())).unwrap();
        let payload: Vec<u8> = (0..SIZE)
            .map(|j| {
                (j as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(i as u32) as u8
            })
            .collect();
        out.push(WriteBlock {
            token_ids: Vec::new(),
            key,
            parent: out.last().map(|p| p.key.clone()),
            token_count: 128,
            payload: payload.into(),
            ttl_ms: 0,
        });
    }
    out
}

/// Reads every key once (one key per request) with `conc` in flight; latencies in ms.
async fn read_pass(c: &Client, keys: &[Key], conc: usize) -> Vec<f64> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (c, keys, next) = (c.clone(), keys.to_vec(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= keys.len() {
                    return lat;
                }
                let t0 = Instant::now();
                let r = c.read(NS, &keys[i..=i], 0).await.unwrap();
                assert_eq!(r.blocks.len(), 1);
                lat.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "notes/003-object-store-tier.json".into());
    let repeats: usize = std::env::var("REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let em = Emulator::azurite().expect("Azurite (run scripts/setup.sh)");
    em.create_container("kvtier").unwrap();
    let blocks = chain();
    let keys: Vec<Key> = blocks.iter().map(|b| b.key.clone()).collect();

    // Floor: the emulator itself through object_store.
    let tier = kvtier_object::ObjectTier::open(kvtier_object::ObjectTierConfig {
        url: em.url("kvtier", "floor"),
        options: em.options(),
        ..Default::default()
    })
    .unwrap();
    let (store, _) = tier
        .locate(&kvtier_core::BlockId::new(
            kvtier_core::Namespace::new("x").unwrap(),
            keys[0].clone(),
        ))
        .unwrap();
    let (mut put, mut get) = (Vec::new(), Vec::new());
    for (i, b) in blocks.iter().enumerate().take(40) {
        let p = kvtier_object::object_store::path::Path::from(format!("floor/{i}"));
        let t0 = Instant::now();
        store.put(&p, b.payload.clone().into()).await.unwrap();
        put.push(t0.elapsed().as_secs_f64() * 1e3);
        let t0 = Instant::now();
        let _ = store.get(&p).await.unwrap().bytes().await.unwrap();
        get.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let floor = json!({
        "put_p50_ms": pct(&mut put.clone(), 0.5), "put_p99_ms": pct(&mut put, 0.99),
        "get_p50_ms": pct(&mut get.clone(), 0.5), "get_p99_ms": pct(&mut get, 0.99), "n": 40,
    });
    eprintln!("floor {floor}");

    // Load the chain once through a write-through node.
    let d0 = tempfile::tempdir().unwrap();
    let w = Server::start(node_cfg(&em, d0.path())).await.unwrap();
    let cw = client(&w, 4).await;
    for b in blocks.chunks(4) {
        cw.write(NS, b).await.unwrap();
    }
    w.shutdown().await.unwrap();

    let mut reads = Vec::new();
    for conc in [1usize, 4, 16, 32] {
        let mut per: std::collections::BTreeMap<&str, (Vec<f64>, Vec<f64>)> = Default::default();
        for _ in 0..repeats {
            let dir = tempfile::tempdir().unwrap();
            // Cold: a fresh node, nothing local.
            let s1 = Server::start(node_cfg(&em, dir.path())).await.unwrap();
            let c1 = client(&s1, conc.min(8)).await;
            let mut cold = read_pass(&c1, &keys, conc).await;
            // Wait for the background copies to disk, then restart on the same disk.
            let t0 = Instant::now();
            while s1.engine.stats().object.unwrap().promotions_to_disk < BLOCKS as u64
                && t0.elapsed() < Duration::from_secs(30)
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            s1.shutdown().await.unwrap();
            let s2 = Server::start(node_cfg(&em, dir.path())).await.unwrap();
            let c2 = client(&s2, conc.min(8)).await;
            let mut warm = read_pass(&c2, &keys, conc).await;
            let mut hot = read_pass(&c2, &keys, conc).await;
            s2.shutdown().await.unwrap();
            for (name, v) in [
                ("cold_object", &mut cold),
                ("warm_disk", &mut warm),
                ("hot_memory", &mut hot),
            ] {
                let e = per.entry(name).or_default();
                e.0.push(pct(&mut v.clone(), 0.5));
                e.1.push(pct(v, 0.99));
            }
        }
        for (name, (p50s, p99s)) in per {
            let row = json!({"tier": name, "concurrency": conc, "p50_ms": median(p50s.clone()), "p99_ms": median(p99s.clone()),
                "p50_ms_repeats": p50s, "p99_ms_repeats": p99s, "reads_per_repeat": BLOCKS});
            eprintln!("{row}");
            reads.push(row);
        }
    }

    // Lookups of the 64-block chain: fully local vs needing the store.
    let mut lookups = Vec::new();
    let (mut local_p50, mut store_p50, mut local_p99, mut store_p99) =
        (vec![], vec![], vec![], vec![]);
    for _ in 0..repeats {
        let dir = tempfile::tempdir().unwrap();
        let s = Server::start(node_cfg(&em, dir.path())).await.unwrap();
        let c = client(&s, 1).await;
        let mut remote = Vec::new();
        for _ in 0..20 {
            let t0 = Instant::now();
            assert_eq!(c.lookup(NS, &keys, None).await.unwrap().found, BLOCKS);
            remote.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        let _ = read_pass(&c, &keys, 8).await;
        let mut local = Vec::new();
        for _ in 0..20 {
            let t0 = Instant::now();
            assert_eq!(c.lookup(NS, &keys, None).await.unwrap().found, BLOCKS);
            local.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        s.shutdown().await.unwrap();
        store_p50.push(pct(&mut remote.clone(), 0.5));
        store_p99.push(pct(&mut remote, 0.99));
        local_p50.push(pct(&mut local.clone(), 0.5));
        local_p99.push(pct(&mut local, 0.99));
    }
    lookups.push(json!({"case": "local", "chain": BLOCKS, "p50_ms": median(local_p50.clone()), "p99_ms": median(local_p99), "p50_ms_repeats": local_p50}));
    lookups.push(json!({"case": "object_store", "chain": BLOCKS, "p50_ms": median(store_p50.clone()), "p99_ms": median(store_p99), "p50_ms_repeats": store_p50}));
    eprintln!("{lookups:?}");

    let doc = json!({
        "experiment": "003-object-store-tier",
        "date": std::env::var("BENCH_DATE").unwrap_or_default(),
        "git_commit": std::env::var("BENCH_COMMIT").unwrap_or_default(),
        "machine": std::env::var("BENCH_MACHINE").unwrap_or_default(),
        "command": std::env::var("BENCH_COMMAND").unwrap_or_default(),
        "store": "Azurite 3.35 (loopback) via object_store 0.12",
        "block_bytes": SIZE, "repeats": repeats,
        "floor_object_store": floor,
        "reads": reads,
        "lookups": lookups,
    });
    std::fs::write(&out, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    eprintln!("wrote {out}");
}
