//! In-process benchmark of the disk tier against the memory tier, for
//! `scripts/bench-disk.sh` (which adds the raw-device baseline and the ratios).
//!
//! Measures, through the [`Tier`] trait (no network, no gRPC):
//!
//! * writes and reads of `--block-bytes` blocks (default 1.2 MB) at each
//!   concurrency in `--conc` (default 1,4,16), repeated `--repeats` times:
//!   - the memory tier;
//!   - the disk tier with `sync = always` and `sync = batch` (writes);
//!   - disk reads with the page cache dropped first (`cold`, needs root to write
//!     `/proc/sys/vm/drop_caches`; skipped otherwise) and with the records
//!     still in the page cache (`warm`);
//! * the warm-restart time (`DiskTier::open`: scan + index rebuild) of a data
//!   set of `--restart-gib` GiB, with and without payload verification, cold.
//!
//! Prints one JSON document on stdout; progress on stderr.
//!
//! ```text
//! cargo run --release -p kvtier-core --example disk_bench -- --dir /work/bench-tmp \
//!     [--block-bytes 1200000] [--blocks 256] [--conc 1,4,16] [--repeats 3] [--restart-gib 10]
//! ```
use bytes::Bytes;
use kvtier_core::memory::MemoryTier;
use kvtier_core::{Block, BlockId, ByteSize, DiskConfig, DiskTier, Key, Namespace, SyncMode, Tier};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Args {
    dir: PathBuf,
    block_bytes: usize,
    blocks: usize,
    conc: Vec<usize>,
    repeats: usize,
    restart_gib: f64,
}

fn args() -> Args {
    let mut a = Args {
        dir: PathBuf::from("bench-disk-tmp"),
        block_bytes: 1_200_000,
        blocks: 256,
        conc: vec![1, 4, 16],
        repeats: 3,
        restart_gib: 10.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--dir" => a.dir = v.into(),
            "--block-bytes" => a.block_bytes = v.parse().unwrap(),
            "--blocks" => a.blocks = v.parse().unwrap(),
            "--conc" => a.conc = v.split(',').map(|x| x.parse().unwrap()).collect(),
            "--repeats" => a.repeats = v.parse().unwrap(),
            "--restart-gib" => a.restart_gib = v.parse().unwrap(),
            _ => panic!("unknown flag {k}"),
        }
    }
    a
}

/// One measured phase: `ops` operations of `bytes` each by `conc` tasks.
#[derive(Debug, Clone)]
struct Sample {
    mb_per_s: f64,
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn pct(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// Runs `op(i)` for i in 0..n from `conc` tasks pulling indices from a counter.
async fn run<F, Fut>(n: usize, conc: usize, bytes: usize, op: F) -> Sample
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (op, next) = (op.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return lat;
                }
                let t = Instant::now();
                op(i).await;
                lat.push(t.elapsed());
            }
        }));
    }
    let mut lat = Vec::with_capacity(n);
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let wall = t0.elapsed().as_secs_f64();
    lat.sort();
    Sample {
        mb_per_s: (n * bytes) as f64 / wall / 1e6,
        ops_per_s: n as f64 / wall,
        p50_ms: pct(&lat, 0.50),
        p99_ms: pct(&lat, 0.99),
    }
}

fn drop_caches() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn blocks(n: usize, bytes: usize, tag: u32) -> Arc<Vec<Block>> {
    // One random-looking payload shared by all blocks (distinct keys); the
    // checksum is computed once per block at construction, outside the timing.
    let mut x = 0x1234_5678_9abc_def0u64 ^ tag as u64;
    let payload: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let payload = Bytes::from(payload);
    let ns = Namespace::new("bench").unwrap();
    Arc::new(
        (0..n)
            .map(|i| {
                let key = Key::new(format!("{tag:08x}-{i:08x}").into_bytes()).unwrap();
                Block::new(BlockId::new(ns.clone(), key), None, 128, payload.clone())
            })
            .collect(),
    )
}

fn open(
    dir: &Path,
    sync: SyncMode,
    capacity: u64,
    verify: bool,
) -> (DiskTier, kvtier_core::RecoveryReport) {
    let mut cfg = DiskConfig::new(dir, ByteSize(capacity));
    cfg.sync = sync;
    cfg.verify_on_open = verify;
    DiskTier::open(cfg).expect("open disk tier")
}

fn json(s: &Sample) -> serde_json::Value {
    serde_json::json!({"mb_per_s": s.mb_per_s, "ops_per_s": s.ops_per_s, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms})
}

async fn write_all(tier: Arc<dyn Tier>, bl: Arc<Vec<Block>>, conc: usize, bytes: usize) -> Sample {
    let n = bl.len();
    run(n, conc, bytes, move |i| {
        let (tier, bl) = (tier.clone(), bl.clone());
        async move {
            tier.put(bl[i].clone()).await.expect("put");
        }
    })
    .await
}

async fn read_all(tier: Arc<dyn Tier>, bl: Arc<Vec<Block>>, conc: usize, bytes: usize) -> Sample {
    let n = bl.len();
    run(n, conc, bytes, move |i| {
        let (tier, bl) = (tier.clone(), bl.clone());
        async move {
            // Read in a scrambled order so reads are not in write order.
            let j = (i * 7919) % bl.len();
            let b = tier
                .get(&bl[j].meta.id)
                .await
                .expect("get")
                .expect("present");
            assert_eq!(b.payload.len(), bl[j].payload.len());
        }
    })
    .await
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = args();
    std::fs::create_dir_all(&a.dir).unwrap();
    let bytes = a.block_bytes;
    let set_bytes = (a.blocks * (bytes + 4096)) as u64;
    let mut results = Vec::new();
    let can_drop = drop_caches();
    if !can_drop {
        eprintln!("cannot write /proc/sys/vm/drop_caches: cold-cache reads are skipped");
    }
    for rep in 0..a.repeats {
        for &c in &a.conc {
            let tag = (rep * 100 + c) as u32;
            let bl = blocks(a.blocks, bytes, tag);
            // Memory tier.
            let mem: Arc<dyn Tier> = Arc::new(MemoryTier::new(set_bytes * 2));
            let w = write_all(mem.clone(), bl.clone(), c, bytes).await;
            let r = read_all(mem.clone(), bl.clone(), c, bytes).await;
            drop(mem);
            eprintln!(
                "rep {rep} c={c:2} memory        write {:8.0} MB/s p50 {:7.2} ms p99 {:7.2} ms | read {:8.0} MB/s p50 {:7.2} ms p99 {:7.2} ms",
                w.mb_per_s, w.p50_ms, w.p99_ms, r.mb_per_s, r.p50_ms, r.p99_ms
            );
            results.push(serde_json::json!({"tier": "memory", "op": "write", "conc": c, "repeat": rep, "sample": json(&w)}));
            results.push(serde_json::json!({"tier": "memory", "op": "read", "conc": c, "repeat": rep, "sample": json(&r)}));
            // Disk tier, per sync mode.
            for sync in [SyncMode::Always, SyncMode::Batch] {
                let dir = a.dir.join(format!("tier-{rep}-{c}-{sync}"));
                let _ = std::fs::remove_dir_all(&dir);
                let (tier, _) = open(&dir, sync, set_bytes * 2, true);
                let tier: Arc<dyn Tier> = Arc::new(tier);
                let w = write_all(tier.clone(), bl.clone(), c, bytes).await;
                eprintln!(
                    "rep {rep} c={c:2} disk/{sync:<6}   write {:8.0} MB/s p50 {:7.2} ms p99 {:7.2} ms",
                    w.mb_per_s, w.p50_ms, w.p99_ms
                );
                results.push(serde_json::json!({"tier": format!("disk-{sync}"), "op": "write", "conc": c, "repeat": rep, "sample": json(&w)}));
                if sync == SyncMode::Always {
                    // Reads do not depend on the sync mode; measure once.
                    let warm = read_all(tier.clone(), bl.clone(), c, bytes).await;
                    results.push(serde_json::json!({"tier": "disk", "op": "read-warm", "conc": c, "repeat": rep, "sample": json(&warm)}));
                    let mut line = format!(
                        "rep {rep} c={c:2} disk          read warm {:8.0} MB/s p50 {:7.2} ms p99 {:7.2} ms",
                        warm.mb_per_s, warm.p50_ms, warm.p99_ms
                    );
                    if can_drop && drop_caches() {
                        let cold = read_all(tier.clone(), bl.clone(), c, bytes).await;
                        results.push(serde_json::json!({"tier": "disk", "op": "read-cold", "conc": c, "repeat": rep, "sample": json(&cold)}));
                        line += &format!(
                            " | cold {:8.0} MB/s p50 {:7.2} ms p99 {:7.2} ms",
                            cold.mb_per_s, cold.p50_ms, cold.p99_ms
                        );
                    }
                    eprintln!("{line}");
                }
                drop(tier);
                std::fs::remove_dir_all(&dir).unwrap();
            }
        }
    }

    // Warm restart of a large data set.
    let mut restart = serde_json::Value::Null;
    if a.restart_gib > 0.0 {
        let dir = a.dir.join("restart");
        let _ = std::fs::remove_dir_all(&dir);
        let n = ((a.restart_gib * (1u64 << 30) as f64) / bytes as f64).ceil() as usize;
        let cap = (n as u64 + 16) * (bytes as u64 + 8192);
        let t0 = Instant::now();
        {
            let (tier, _) = open(&dir, SyncMode::Never, cap, true);
            let tier: Arc<dyn Tier> = Arc::new(tier);
            // Fill in chunks so the block list stays small.
            let chunk = 512;
            let mut done = 0;
            while done < n {
                let k = chunk.min(n - done);
                let bl = blocks(k, bytes, 1_000_000 + done as u32);
                write_all(tier.clone(), bl, 8, bytes).await;
                done += k;
                eprintln!("restart set: {done}/{n} blocks written");
            }
        }
        let _ = std::process::Command::new("sync").status();
        let fill_s = t0.elapsed().as_secs_f64();
        let mut runs = Vec::new();
        for rep in 0..a.repeats {
            for verify in [true, false] {
                let cold = can_drop && drop_caches();
                let t = Instant::now();
                let (tier, report) = open(&dir, SyncMode::Always, cap, verify);
                let wall = t.elapsed().as_secs_f64();
                assert_eq!(report.blocks as usize, n, "every block recovered");
                assert_eq!(report.dropped(), 0);
                drop(tier);
                eprintln!(
                    "restart rep {rep} verify_on_open={verify} cold={cold}: {n} blocks in {wall:.2} s (rebuild {:.2} s)",
                    report.elapsed.as_secs_f64()
                );
                runs.push(serde_json::json!({"repeat": rep, "verify_on_open": verify, "page_cache_dropped": cold,
                    "open_seconds": wall, "rebuild_seconds": report.elapsed.as_secs_f64(), "blocks": report.blocks,
                    "bytes": report.bytes}));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
        restart = serde_json::json!({"gib": a.restart_gib, "blocks": n, "block_bytes": bytes, "fill_seconds": fill_s, "runs": runs});
    }
    let out = serde_json::json!({
        "mode": "in-process, kvtier_core Tier trait (MemoryTier / DiskTier), no gRPC",
        "block_bytes": bytes,
        "blocks_per_phase": a.blocks,
        "repeats": a.repeats,
        "conc": a.conc,
        "page_cache_dropped_for_cold_reads": can_drop,
        "tokio_worker_threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "results": results,
        "restart": restart,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
