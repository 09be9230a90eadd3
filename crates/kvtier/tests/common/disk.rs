//! A `kvtier serve` with a disk tier for the fault-injection tests
//! (`disk_restarts.rs`, `disk_corruption.rs`, `disk_refusals.rs`): started on
//! ephemeral ports, ready when it prints its `--ready-json` line, its stderr
//! logged to a file; stopped by its own PID (SIGKILL via `Child::kill`,
//! SIGTERM via `kill -TERM <pid>`). Also the chains of blocks these tests
//! write (payloads derived from the keys) and the check that reads them back.
use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The namespace every block of these tests is written in.
pub const NS: &str = "faults";

/// A running `kvtier serve` whose stderr goes to a file.
pub struct Served {
    child: Child,
    grpc: String,
    http: String,
    log: PathBuf,
}

/// Starts `kvtier serve` with a disk tier in `dir`; returns the server, or the
/// exit status and stderr when it exits before becoming ready.
pub fn try_start(
    dir: &Path,
    log: &Path,
    extra: &[&str],
) -> Result<Served, (std::process::ExitStatus, String)> {
    let err = std::fs::File::create(log).expect("create log file");
    let mut child = super::serve_command()
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

/// [`try_start`], panicking with the server's stderr when it does not start.
pub fn start(dir: &Path, log: &Path, extra: &[&str]) -> Served {
    match try_start(dir, log, extra) {
        Ok(s) => s,
        Err((st, stderr)) => panic!("server did not start ({st}):\n{stderr}"),
    }
}

impl Served {
    /// SIGKILL by PID and reap.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM by PID and wait (bounded) for a clean exit.
    pub fn stop(mut self) {
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

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /metrics` over plain HTTP/1.1.
    pub fn metrics(&self) -> String {
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
    pub fn metric(&self, series: &str) -> f64 {
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

    pub async fn client(&self) -> Client {
        let mut cfg = ClientConfig::new(self.grpc.clone());
        cfg.timeout = Duration::from_secs(30);
        Client::connect(cfg).await.expect("connect")
    }
}

/// A two-worker runtime for the async client (the tests themselves are sync).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Deterministic payload of 64–256 KiB derived from the key (splitmix64).
pub fn payload_for(key: &[u8]) -> Bytes {
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

/// A key made of `parts`, big-endian.
pub fn key(parts: &[u32]) -> Key {
    let mut b = Vec::with_capacity(parts.len() * 4);
    for p in parts {
        b.extend_from_slice(&p.to_be_bytes());
    }
    Key::new(b).unwrap()
}

/// A chain of blocks: `keys[i]`'s parent is `keys[i-1]`; payloads from the keys.
pub fn chain(keys: &[Key]) -> Vec<WriteBlock> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| WriteBlock {
            token_ids: Vec::new(),
            key: k.clone(),
            parent: i.checked_sub(1).map(|p| keys[p].clone()),
            token_count: 16,
            payload: payload_for(k.as_bytes()),
            ttl_ms: 0,
        })
        .collect()
}

/// Reads each chain in full and checks every byte; returns blocks checked.
pub async fn verify_chains(client: &Client, chains: &[Vec<Key>], what: &str) -> usize {
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
pub fn log_field(log: &str, msg: &str, name: &str) -> Option<u64> {
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
