//! Fault injection against the real `kvtier` binary with a disk tier:
//! SIGKILL crash loops, corruption while stopped, a full tier, an unusable
//! `--disk-dir`, and warm restarts. Servers are started on ephemeral ports and
//! are ready when they print their `--ready-json` line; they are stopped by
//! their own PID (SIGKILL via `Child::kill`, SIGTERM via `kill -TERM <pid>`).
use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, Tier, WriteBlock};
use kvtier_core::Key;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::BIN;
const NS: &str = "faults";

/// A running `kvtier serve` whose stderr goes to a file.
struct Served {
    child: Child,
    grpc: String,
    http: String,
    log: PathBuf,
}

/// Starts `kvtier serve` with a disk tier in `dir`; returns the server, or the
/// exit status and stderr when it exits before becoming ready.
fn try_start(
    dir: &Path,
    log: &Path,
    extra: &[&str],
) -> Result<Served, (std::process::ExitStatus, String)> {
    let err = std::fs::File::create(log).expect("create log file");
    let mut child = common::serve_command()
        .arg("--disk-dir")
        .arg(dir)
        .args(extra)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .spawn()
        .expect("spawn kvtier serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read ready line");
    if line.trim().is_empty() {
        // Exited (or closed stdout) before it was ready.
        let st = child.wait().expect("wait");
        return Err((st, std::fs::read_to_string(log).unwrap_or_default()));
    }
    let v: serde_json::Value = serde_json::from_str(&line).expect("ready json");
    assert_eq!(
        v["pid"].as_u64(),
        Some(child.id() as u64),
        "ready line names the child's pid"
    );
    Ok(Served {
        grpc: format!("http://{}", v["grpc"][0].as_str().unwrap()),
        http: v["http"].as_str().unwrap().to_string(),
        child,
        log: log.to_path_buf(),
    })
}

fn start(dir: &Path, log: &Path, extra: &[&str]) -> Served {
    match try_start(dir, log, extra) {
        Ok(s) => s,
        Err((st, stderr)) => panic!("server did not start ({st}):\n{stderr}"),
    }
}

impl Served {
    /// SIGKILL by PID and reap.
    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM by PID and wait (bounded) for a clean exit.
    fn stop(mut self) {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(
                    st.success(),
                    "graceful exit on SIGTERM: {st}\n{}",
                    self.stderr()
                );
                return;
            }
            assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /metrics` over plain HTTP/1.1.
    fn metrics(&self) -> String {
        let mut s = std::net::TcpStream::connect(&self.http).expect("connect http");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.http
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out
    }

    /// Value of an unlabelled (or exactly labelled) series in /metrics.
    fn metric(&self, series: &str) -> f64 {
        let m = self.metrics();
        for line in m.lines() {
            if let Some(rest) = line.strip_prefix(series)
                && let Some(v) = rest.strip_prefix(' ')
            {
                return v.trim().parse().unwrap_or_else(|_| panic!("{line}"));
            }
        }
        panic!("no series {series} in /metrics:\n{m}")
    }

    async fn client(&self) -> Client {
        let mut cfg = ClientConfig::new(self.grpc.clone());
        cfg.timeout = Duration::from_secs(30);
        Client::connect(cfg).await.expect("connect")
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Deterministic payload of 64–256 KiB derived from the key (splitmix64).
fn payload_for(key: &[u8]) -> Bytes {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for &b in key {
        seed = (seed ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let len = (64 << 10) + (seed % 193) as usize * 1024;
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed;
    while out.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

fn key(parts: &[u32]) -> Key {
    let mut b = Vec::with_capacity(parts.len() * 4);
    for p in parts {
        b.extend_from_slice(&p.to_be_bytes());
    }
    Key::new(b).unwrap()
}

/// A chain of blocks: `keys[i]`'s parent is `keys[i-1]`; payloads from the keys.
fn chain(keys: &[Key]) -> Vec<WriteBlock> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| WriteBlock {
            key: k.clone(),
            parent: i.checked_sub(1).map(|p| keys[p].clone()),
            token_count: 16,
            payload: payload_for(k.as_bytes()),
            ttl_ms: 0,
        })
        .collect()
}

/// Reads each chain in full and checks every byte; returns blocks checked.
async fn verify_chains(client: &Client, chains: &[Vec<Key>], what: &str) -> usize {
    let chains = Arc::new(chains.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (client, chains, next, what) = (
            client.clone(),
            chains.clone(),
            next.clone(),
            what.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(keys) = chains.get(i) else { return n };
                // The client verifies each block's crc32c end to end; a mismatch is an error.
                let r = client.read(NS, keys, 0).await.unwrap_or_else(|e| panic!("{what}: read of chain {i}: {e}"));
                assert!(
                    !r.partial && r.blocks.len() == keys.len(),
                    "{what}: acknowledged chain {i} ({} blocks, first key {:?}) came back with {} blocks ({})",
                    keys.len(),
                    keys[0],
                    r.blocks.len(),
                    r.reason
                );
                for (b, k) in r.blocks.iter().zip(keys) {
                    assert_eq!(&b.key, k);
                    assert!(b.payload == payload_for(k.as_bytes()), "{what}: block {k:?} is not byte-identical");
                    n += 1;
                }
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

/// Parses `name=value` from the last log line containing `msg`.
fn log_field(log: &str, msg: &str, name: &str) -> Option<u64> {
    let pat = format!(" {name}=");
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(msg) && l.contains(&pat))?;
    let at = line.find(&pat)? + pat.len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// SIGKILL mid-load under `--disk-sync always`, restart, verify every
/// acknowledged block, 20+ times on the same directory.
#[test]
fn sigkill_crash_loop_loses_no_acknowledged_block() {
    const CYCLES: u32 = 20;
    const WRITERS: u32 = 4;
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    let args = [
        "--disk-sync",
        "always",
        "--memory-capacity",
        "1MiB",
        "--max-block-size",
        "1MiB",
        "--disk-capacity",
        "4GiB",
    ];
    let rt = runtime();
    let mut acked: Vec<Vec<Key>> = Vec::new();
    let mut killed_in_flight = 0usize;
    let retried = Arc::new(AtomicUsize::new(0));
    let mut temp_files = 0u64;
    // Client retries (on UNAVAILABLE) are logged at debug level; shown on failure.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("kvtier_client=debug")
        .with_test_writer()
        .try_init();
    for cycle in 0..=CYCLES {
        let mut server = Some(start(&dir, &log, &args));
        let s = server.as_ref().unwrap();
        let recovered = log_field(&s.stderr(), "disk tier recovered", "blocks");
        let report = (
            s.metric("kvtier_disk_recovered_blocks"),
            s.metric("kvtier_disk_recovery_dropped_files{reason=\"torn\"}"),
            s.metric("kvtier_disk_recovery_dropped_files{reason=\"corrupt\"}"),
        );
        // A SIGKILL can leave temp files, never torn or corrupt records.
        assert_eq!(
            (report.1, report.2),
            (0.0, 0.0),
            "cycle {cycle}: recovery dropped records:\n{}",
            s.stderr()
        );
        temp_files += s.metric("kvtier_disk_recovery_dropped_files{reason=\"temp_file\"}") as u64;
        let acked_blocks: usize = acked.iter().map(Vec::len).sum();
        assert!(
            report.0 as usize >= acked_blocks,
            "cycle {cycle}: recovered {report:?} < {acked_blocks} acked"
        );
        assert_eq!(
            recovered,
            Some(report.0 as u64),
            "the log reports the recovery"
        );
        rt.block_on(async {
            let client = server.as_ref().unwrap().client().await;
            // Everything acknowledged in any earlier cycle is present and intact.
            let n = verify_chains(&client, &acked, &format!("cycle {cycle}")).await;
            assert_eq!(n, acked_blocks);
            if cycle == CYCLES {
                return;
            }
            // Write load from several tasks; SIGKILL after a cycle-dependent number of acks.
            let target = 3 + (cycle as usize * 7) % 13;
            let acks = Arc::new(AtomicUsize::new(0));
            let reached = Arc::new(tokio::sync::Notify::new());
            let killed = Arc::new(AtomicBool::new(false));
            let new_acked = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for w in 0..WRITERS {
                let (client, acks, reached, killed, new_acked, retried) = (
                    client.clone(),
                    acks.clone(),
                    reached.clone(),
                    killed.clone(),
                    new_acked.clone(),
                    retried.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    for i in 0u32.. {
                        let len = 1 + (cycle + w + i) % 3;
                        let keys: Vec<Key> = (0..len).map(|p| key(&[cycle, w, i, p])).collect();
                        match client.write(NS, &chain(&keys)).await {
                            Ok(r) => {
                                // Fresh keys: all stored, unless the client retried a
                                // request whose first attempt stored some of them.
                                assert_eq!(r.stored + r.existing, len);
                                if r.existing > 0 {
                                    retried.fetch_add(1, Ordering::Relaxed);
                                }
                                new_acked.lock().unwrap().push(keys);
                                if acks.fetch_add(1, Ordering::SeqCst) + 1 == target {
                                    reached.notify_one();
                                }
                            }
                            Err(e) => {
                                assert!(
                                    killed.load(Ordering::SeqCst),
                                    "write failed before the kill: {e}"
                                );
                                return;
                            }
                        }
                    }
                }));
            }
            reached.notified().await;
            killed.store(true, Ordering::SeqCst);
            server.take().unwrap().kill9();
            for t in &tasks {
                t.abort();
            }
            for t in tasks {
                if let Err(e) = t.await {
                    assert!(e.is_cancelled(), "writer panicked: {e}");
                    killed_in_flight += 1;
                }
            }
            acked.extend(new_acked.lock().unwrap().drain(..));
        });
        if let Some(s) = server {
            s.stop();
        }
    }
    let blocks: usize = acked.iter().map(Vec::len).sum();
    eprintln!(
        "{CYCLES} SIGKILL cycles: {} acknowledged writes ({blocks} blocks) all intact, {killed_in_flight} writers killed mid-write, \
         {temp_files} interrupted .tmp records removed at restarts, {} writes acknowledged after a client retry, {:?}",
        acked.len(),
        retried.load(Ordering::Relaxed),
        t0.elapsed()
    );
    assert!(blocks >= CYCLES as usize * 3);
}

/// Finds the record file holding `key` by parsing headers (docs/disk-format.md).
fn record_file(dir: &Path, key: &[u8]) -> (PathBuf, usize, usize) {
    let mut found = None;
    for shard in std::fs::read_dir(dir.join("blocks")).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_none_or(|e| e != "kvb") {
                continue;
            }
            let buf = std::fs::read(&p).unwrap();
            assert_eq!(&buf[0..4], b"KVTB");
            let h = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
            let plen = u64::from_le_bytes(buf[20..28].try_into().unwrap()) as usize;
            let n = u16::from_le_bytes(buf[44..46].try_into().unwrap()) as usize;
            let k = u16::from_le_bytes(buf[46..48].try_into().unwrap()) as usize;
            assert_eq!(buf.len(), h + plen, "{}", p.display());
            if &buf[52..52 + n] == NS.as_bytes() && &buf[52 + n..52 + n + k] == key {
                assert!(found.is_none(), "one record per key");
                found = Some((p, h, plen));
            }
        }
    }
    found.expect("record file for key")
}

fn flip_byte(path: &Path, at: usize) {
    let mut buf = std::fs::read(path).unwrap();
    buf[at] ^= 0x40;
    std::fs::write(path, buf).unwrap();
}

/// A byte flipped in a stored payload while the server is stopped: that block
/// is missing after restart (never returned), everything else is intact.
#[test]
fn corruption_while_stopped_is_a_miss_not_wrong_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    let args = ["--disk-sync", "always", "--memory-capacity", "64MiB"];
    let singles: Vec<Vec<Key>> = (0..8).map(|i| vec![key(&[1, i])]).collect();
    let chain3: Vec<Key> = (0..3).map(|i| key(&[2, i])).collect();
    let s = start(&dir, &log, &args);
    let rt = runtime();
    rt.block_on(async {
        let c = s.client().await;
        for ks in singles.iter().chain([&chain3]) {
            c.write(NS, &chain(ks)).await.unwrap();
        }
    });
    s.stop();
    // Corrupt one single block and the middle of the chain.
    for k in [&singles[3][0], &chain3[1]] {
        let (p, h, plen) = record_file(&dir, k.as_bytes());
        flip_byte(&p, h + plen / 2);
    }
    let s = start(&dir, &log, &args);
    let log_text = s.stderr();
    assert_eq!(
        log_field(&log_text, "disk tier recovered", "corrupt"),
        Some(2),
        "{log_text}"
    );
    assert!(log_text.contains("dropping corrupt record"), "{log_text}");
    assert_eq!(
        s.metric("kvtier_disk_recovery_dropped_files{reason=\"corrupt\"}"),
        2.0
    );
    assert_eq!(
        s.metric("kvtier_disk_recovered_blocks"),
        9.0,
        "8 + 3 stored, 2 dropped"
    );
    rt.block_on(async {
        let c = s.client().await;
        let bad = &singles[3];
        let l = c.lookup(NS, bad, None).await.unwrap();
        assert_eq!(l.found, 0, "the corrupt block is reported missing");
        let r = c.read(NS, bad, 0).await.unwrap();
        assert!(r.blocks.is_empty() && r.partial, "never returned");
        let l = c.lookup(NS, &chain3, None).await.unwrap();
        assert_eq!(l.found, 1, "the chain stops at the corrupt block");
        let r = c.read(NS, &chain3, 0).await.unwrap();
        assert_eq!(r.blocks.len(), 1);
        assert!(r.blocks[0].payload == payload_for(chain3[0].as_bytes()));
        let good: Vec<Vec<Key>> = singles
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 3)
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(verify_chains(&c, &good, "intact").await, 7);
        // Re-writing the block repairs it.
        c.write(NS, &chain(bad)).await.unwrap();
        assert_eq!(
            verify_chains(&c, std::slice::from_ref(bad), "repaired").await,
            1
        );
    });
    s.stop();

    // Corruption after open (the server is running, the record is not in
    // memory): detected on read, served as a miss, counted.
    let args_small_mem = [
        "--disk-sync",
        "always",
        "--memory-capacity",
        "1MiB",
        "--max-block-size",
        "1MiB",
    ];
    let s = start(&dir, &log, &args_small_mem);
    let victim = &singles[5];
    let (p, h, plen) = record_file(&dir, victim[0].as_bytes());
    flip_byte(&p, h + plen - 1);
    rt.block_on(async {
        let c = s.client().await;
        let l = c.lookup(NS, victim, None).await.unwrap();
        assert_eq!(
            (l.found, l.tiers.as_slice()),
            (1, &[Tier::Disk][..]),
            "lookups trust the index"
        );
        let r = c.read(NS, victim, 0).await.unwrap();
        assert!(
            r.blocks.is_empty(),
            "bytes that fail their checksum are never returned"
        );
        assert_eq!(
            c.lookup(NS, victim, None).await.unwrap().found,
            0,
            "and the record is gone"
        );
    });
    assert_eq!(s.metric("kvtier_disk_corrupt_on_read_total"), 1.0);
    assert!(!p.exists(), "the corrupt file is unlinked");
    s.stop();
}

/// A tier smaller than the data: writes that cannot fit fail with
/// RESOURCE_EXHAUSTED under `always` and reads of what is stored continue.
///
/// A real ENOSPC (on a tmpfs the test mounts) is
/// `enospc_is_resource_exhausted_and_reads_continue` in
/// `kvtier-core/tests/disk.rs`; both paths share the same error mapping.
#[test]
fn full_disk_tier_refuses_writes_and_keeps_serving_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    // 1 MiB of disk: four or five 64–256 KiB blocks of one chain. Only leaves
    // that are not the new block's parent can be evicted, so a chain longer
    // than the tier cannot be stored.
    let args = [
        "--disk-sync",
        "always",
        "--disk-capacity",
        "1MiB",
        "--max-block-size",
        "256KiB",
        "--memory-capacity",
        "64MiB",
    ];
    let s = start(&dir, &log, &args);
    let keys: Vec<Key> = (0..12).map(|i| key(&[3, i])).collect();
    let blocks = chain(&keys);
    let rt = runtime();
    let stored = rt.block_on(async {
        let c = s.client().await;
        let mut stored = 0;
        for b in &blocks {
            match c.write(NS, std::slice::from_ref(b)).await {
                Ok(_) => stored += 1,
                Err(e) => {
                    assert_eq!(
                        e.code().map(|c| c as i32),
                        Some(8),
                        "RESOURCE_EXHAUSTED: {e}"
                    );
                    assert!(e.to_string().contains("full"), "{e}");
                    break;
                }
            }
        }
        assert!((2..keys.len()).contains(&stored), "stored {stored}");
        // Under `always` a refused write is not kept in memory either.
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert_eq!(
            l.found, stored,
            "exactly the acknowledged prefix is present"
        );
        // The server keeps serving reads of what it has.
        let r = c.read(NS, &keys[..stored], 0).await.unwrap();
        assert_eq!(r.blocks.len(), stored);
        for (b, k) in r.blocks.iter().zip(&keys) {
            assert!(b.payload == payload_for(k.as_bytes()));
        }
        // Independent blocks still fit by evicting other leaves: not an error.
        c.write(NS, &chain(&[key(&[4, 0])])).await.unwrap();
        stored
    });
    assert!(s.metric("kvtier_disk_write_exhausted_total") >= 1.0);
    assert!(s.metric("kvtier_disk_write_errors_total") == 0.0);
    s.stop();
    eprintln!(
        "full tier: {stored} of {} chain blocks stored, then RESOURCE_EXHAUSTED",
        keys.len()
    );
}

/// An unusable `--disk-dir` stops the process at start, quickly, naming the path.
#[test]
fn unusable_disk_dir_exits_nonzero_naming_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("regular-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("disk");
    let t0 = Instant::now();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "",
            "--ready-json",
            "--disk-dir",
        ])
        .arg(&bad)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "never reported ready");
    assert!(
        stderr.contains(bad.to_str().unwrap()),
        "stderr names the path: {stderr}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    // A directory held by another server is refused the same way.
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("a.log");
    let a = start(&dir, &log, &[]);
    let b = try_start(&dir, &tmp.path().join("b.log"), &[]);
    let (st, stderr) = b.err().expect("second server on the same dir must fail");
    assert!(!st.success());
    assert!(
        stderr.contains(dir.to_str().unwrap()) && stderr.contains("in use"),
        "{stderr}"
    );
    a.stop();
}

/// After a restart memory is empty: lookups report TIER_DISK, reads promote,
/// and the recovery report is logged and exported.
#[test]
fn warm_restart_serves_from_disk_and_reports_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    let args = ["--disk-sync", "batch", "--memory-capacity", "64MiB"];
    let keys: Vec<Key> = (0..6).map(|i| key(&[5, i])).collect();
    let s = start(&dir, &log, &args);
    assert_eq!(s.metric("kvtier_disk_recovered_blocks"), 0.0);
    let rt = runtime();
    rt.block_on(async {
        let c = s.client().await;
        c.write(NS, &chain(&keys)).await.unwrap();
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert!(l.tiers.iter().all(|t| *t == Tier::Memory), "{:?}", l.tiers);
    });
    s.stop();
    let s = start(&dir, &log, &args);
    let text = s.stderr();
    assert_eq!(
        log_field(&text, "disk tier recovered", "blocks"),
        Some(keys.len() as u64),
        "{text}"
    );
    assert!(
        log_field(&text, "disk tier recovered", "elapsed_ms").is_some(),
        "{text}"
    );
    assert_eq!(s.metric("kvtier_disk_recovered_blocks"), keys.len() as f64);
    assert!(s.metric("kvtier_disk_recovery_seconds") >= 0.0);
    assert_eq!(s.metric("kvtier_tier_blocks{tier=\"memory\"}"), 0.0);
    rt.block_on(async {
        let c = s.client().await;
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert_eq!(l.found, keys.len());
        assert!(l.tiers.iter().all(|t| *t == Tier::Disk), "{:?}", l.tiers);
        let r = c.read(NS, &keys, 0).await.unwrap();
        assert_eq!(r.blocks.len(), keys.len());
        for (b, k) in r.blocks.iter().zip(&keys) {
            assert_eq!(b.tier, Tier::Disk);
            assert!(b.payload == payload_for(k.as_bytes()));
        }
        // Disk hits were promoted.
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert!(l.tiers.iter().all(|t| *t == Tier::Memory), "{:?}", l.tiers);
    });
    s.stop();
}
