//! Real object-store emulators for tests and measurements: Azurite (Azure
//! Blob) and MinIO (S3), started on loopback with an ephemeral port and a
//! temporary directory, probed until ready, stopped by PID.
//!
//! Binaries are found through `KVTIER_AZURITE_BLOB` / `KVTIER_MINIO`, then
//! the well-known paths `scripts/setup.sh` installs to (`.tools/azurite`,
//! `.tools/bin/minio`), then `$HOME/go/bin/minio` and `PATH`. A missing one is
//! an error telling to run `scripts/setup.sh`: tests never skip silently.
pub use crate::codec::synth::kv_like_bf16;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Azurite's blob service (Azure Blob Storage).
    Azurite,
    /// MinIO (S3).
    Minio,
}

/// Azurite's well-known development account and key.
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development key.
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const MINIO_USER: &str = "kvtieradmin";
const MINIO_PASSWORD: &str = "kvtieradmin-secret";

/// A running emulator; killed on drop.
pub struct Emulator {
    /// Which one.
    pub kind: Kind,
    /// Its loopback port.
    pub port: u16,
    /// Its data directory.
    pub dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

fn repo_root() -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !p.join(".git").exists() && !p.join("scripts/setup.sh").exists() {
        if !p.pop() {
            return PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        }
    }
    p
}

/// Path of Azurite's blob entry point (`.../azurite/dist/src/blob/main.js`).
pub fn azurite_path() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("KVTIER_AZURITE_BLOB") {
        return Ok(PathBuf::from(p));
    }
    let p = repo_root().join(".tools/azurite/node_modules/azurite/dist/src/blob/main.js");
    if p.exists() {
        return Ok(p);
    }
    Err(format!(
        "Azurite not found at {} (or $KVTIER_AZURITE_BLOB): run scripts/setup.sh",
        p.display()
    ))
}

/// Path of the MinIO server binary.
pub fn minio_path() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("KVTIER_MINIO") {
        return Ok(PathBuf::from(p));
    }
    let mut candidates = vec![repo_root().join(".tools/bin/minio")];
    if let Ok(h) = std::env::var("HOME") {
        candidates.push(Path::new(&h).join("go/bin/minio"));
    }
    if let Ok(path) = std::env::var("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("minio")));
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        "MinIO not found in .tools/bin, ~/go/bin or PATH (or $KVTIER_MINIO): run scripts/setup.sh".to_string()
    })
}

fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct loopback ports free right now, for a process the caller
/// starts later (a config names them before anything binds).
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), where
/// neither `bind(0)` nor an outgoing connection's source port can land: a
/// port released here cannot be taken in the window before its user binds
/// it by any of the many connections a test run opens (the race seen as
/// "Address already in use" in cluster tests). Falls back to `bind(0)`
/// when the range leaves no room below it.
pub fn free_ports(n: usize) -> Vec<u16> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    const FLOOR: u32 = 10_000;
    let span = low.saturating_sub(FLOOR);
    // Each process starts at its own place in the range, so concurrent test
    // binaries rarely probe the same ports; within a process every candidate
    // is taken once, so two calls never return the same port.
    let base = std::process::id().wrapping_mul(2_654_435_761) % span.max(1);
    let mut held = Vec::with_capacity(n);
    for _ in 0..span {
        if held.len() == n {
            break;
        }
        let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = (FLOOR + base.wrapping_add(next) % span) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    while held.len() < n {
        held.push(TcpListener::bind("127.0.0.1:0").expect("bind loopback"));
    }
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("kvtier-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

/// One raw HTTP/1.1 request; returns the status code and the start of the answer.
fn http_request(port: u16, req: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(1000))).ok()?;
    s.write_all(req.as_bytes()).ok()?;
    let mut buf = [0u8; 2048];
    let n = s.read(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text))
}

fn http_status(port: u16, req: &str) -> Option<u16> {
    http_request(port, req).map(|r| r.0)
}

impl Emulator {
    /// Starts Azurite's blob service.
    pub fn azurite() -> Result<Self, String> {
        Self::start(Kind::Azurite, temp_dir("azurite"), None)
    }

    /// Starts MinIO.
    pub fn minio() -> Result<Self, String> {
        Self::start(Kind::Minio, temp_dir("minio"), None)
    }

    fn start(kind: Kind, dir: PathBuf, port: Option<u16>) -> Result<Self, String> {
        let mut last = String::new();
        // A free port can be taken between probing and binding: retry.
        for _ in 0..5 {
            let port = port.unwrap_or_else(free_port);
            let log = dir.join(format!("emulator-{port}.log"));
            let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
            let err = out.try_clone().map_err(|e| e.to_string())?;
            let mut cmd = match kind {
                Kind::Azurite => {
                    let mut c = Command::new("node");
                    c.arg(azurite_path()?)
                        .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                        .arg("--location")
                        .arg(&dir)
                        .args(["--skipApiVersionCheck", "--loose", "--silent"]);
                    c
                }
                Kind::Minio => {
                    let mut c = Command::new(minio_path()?);
                    c.arg("server")
                        .arg(dir.join("data"))
                        .args(["--address", &format!("127.0.0.1:{port}")])
                        .args(["--console-address", &format!("127.0.0.1:{}", free_port())])
                        .arg("--quiet")
                        .env("MINIO_ROOT_USER", MINIO_USER)
                        .env("MINIO_ROOT_PASSWORD", MINIO_PASSWORD)
                        .env("MINIO_BROWSER", "off")
                        .env("MINIO_UPDATE", "off");
                    c
                }
            };
            let child = cmd
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(|e| format!("cannot start {kind:?}: {e} (run scripts/setup.sh)"))?;
            let mut em = Emulator {
                kind,
                port,
                dir: dir.clone(),
                child: Some(child),
                log,
            };
            match em.wait_ready(Duration::from_secs(30)) {
                Ok(()) => return Ok(em),
                Err(e) => {
                    last = e;
                    em.stop();
                }
            }
        }
        Err(last)
    }

    fn ready(&self) -> bool {
        match self.kind {
            // Any HTTP answer means the blob service is listening.
            Kind::Azurite => http_status(
                self.port,
                "GET /devstoreaccount1?comp=list HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            )
            .is_some(),
            Kind::Minio => {
                http_status(
                    self.port,
                    "GET /minio/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                ) == Some(200)
            }
        }
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                return Err(format!(
                    "{:?} exited with {st} on port {}: {log}",
                    self.kind, self.port
                ));
            }
            if self.ready() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "{:?} not ready on port {} after {limit:?}",
            self.kind, self.port
        ))
    }

    /// The process id (for SIGSTOP / SIGCONT).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the emulator (SIGTERM, SIGKILL after 5 s) and waits for it;
    /// data stays in `dir` (Azurite saves its metadata on SIGTERM).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        let em = Self::start(self.kind, self.dir.clone(), Some(self.port))?;
        let mut em = std::mem::ManuallyDrop::new(em);
        self.child = em.child.take();
        self.log = std::mem::take(&mut em.log);
        Ok(())
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    /// Freezes the process (SIGSTOP): connections are accepted by the kernel, never answered.
    ///
    /// Returns once every thread of the process is stopped: `kill` only
    /// queues the signal, and a thread that is running on another core can
    /// still answer a request or two before it takes the signal.
    pub fn pause(&self) {
        self.signal("-STOP");
        self.wait_threads(true);
    }

    /// Resumes a paused process (SIGCONT) and returns once no thread is stopped.
    pub fn resume(&self) {
        self.signal("-CONT");
        self.wait_threads(false);
    }

    /// Polls `/proc/<pid>/task/*/stat` until every thread is (or no thread
    /// is) in the stopped state, for at most 10 s.
    fn wait_threads(&self, stopped: bool) {
        let Some(pid) = self.pid() else { return };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            match thread_states(pid) {
                Some(states) if states.iter().all(|&s| (s == 'T') == stopped) => return,
                None => return,
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        panic!("emulator pid {pid}: threads did not reach stopped={stopped} within 10 s");
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        match self.kind {
            Kind::Azurite => format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port),
            Kind::Minio => format!("http://127.0.0.1:{}", self.port),
        }
    }

    /// A store URL for `container` (created first) with `prefix`.
    pub fn url(&self, container: &str, prefix: &str) -> String {
        let scheme = match self.kind {
            Kind::Azurite => "az",
            Kind::Minio => "s3",
        };
        format!("{scheme}://{container}/{prefix}")
    }

    /// `object_store` options addressing this emulator (no environment
    /// variables needed, so tests can run several emulators at once).
    pub fn options(&self) -> BTreeMap<String, String> {
        let kv: Vec<(&str, String)> = match self.kind {
            Kind::Azurite => vec![
                ("azure_storage_account_name", AZURITE_ACCOUNT.into()),
                ("azure_storage_account_key", AZURITE_KEY.into()),
                ("azure_storage_endpoint", self.endpoint()),
                ("azure_allow_http", "true".into()),
            ],
            Kind::Minio => vec![
                ("aws_endpoint", self.endpoint()),
                ("aws_access_key_id", MINIO_USER.into()),
                ("aws_secret_access_key", MINIO_PASSWORD.into()),
                ("aws_region", "us-east-1".into()),
                ("aws_allow_http", "true".into()),
                ("aws_virtual_hosted_style_request", "false".into()),
            ],
        };
        kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Creates a container (Azurite) or bucket (MinIO) with a signed request
    /// (object_store itself never creates them).
    pub fn create_container(&self, name: &str) -> Result<(), String> {
        let now = std::time::SystemTime::now();
        let req = match self.kind {
            Kind::Minio => {
                // 2026-11-23T14:10:00Z -> 20261123T141000Z
                let amz_date: String = humantime::format_rfc3339_seconds(now)
                    .to_string()
                    .replace(['-', ':'], "");
                let date = &amz_date[..8];
                let host = format!("127.0.0.1:{}", self.port);
                let ph = hex::encode(ring::digest::digest(&ring::digest::SHA256, b"").as_ref());
                let canonical = format!(
                    "PUT\n/{name}\n\nhost:{host}\nx-amz-content-sha256:{ph}\nx-amz-date:{amz_date}\n\nhost;x-amz-content-sha256;x-amz-date\n{ph}"
                );
                let scope = format!("{date}/us-east-1/s3/aws4_request");
                let sts = format!(
                    "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
                    hex::encode(
                        ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes()).as_ref()
                    )
                );
                let mut k = hmac(format!("AWS4{MINIO_PASSWORD}").as_bytes(), date.as_bytes());
                for part in ["us-east-1", "s3", "aws4_request"] {
                    k = hmac(&k, part.as_bytes());
                }
                let sig = hex::encode(hmac(&k, sts.as_bytes()));
                format!(
                    "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nx-amz-content-sha256: {ph}\r\nx-amz-date: {amz_date}\r\nAuthorization: AWS4-HMAC-SHA256 Credential={MINIO_USER}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
            }
            Kind::Azurite => {
                let date = httpdate::fmt_http_date(now);
                let path = format!("/{AZURITE_ACCOUNT}/{name}");
                let sts = format!(
                    "PUT\n{}x-ms-date:{date}\nx-ms-version:2021-08-06\n/{AZURITE_ACCOUNT}{path}\nrestype:container",
                    "\n".repeat(11)
                );
                use base64::Engine as _;
                let b64 = base64::engine::general_purpose::STANDARD;
                let key = b64.decode(AZURITE_KEY).map_err(|e| e.to_string())?;
                let sig = b64.encode(hmac(&key, sts.as_bytes()));
                format!(
                    "PUT {path}?restype=container HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nx-ms-date: {date}\r\nx-ms-version: 2021-08-06\r\nAuthorization: SharedKey {AZURITE_ACCOUNT}:{sig}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.port
                )
            }
        };
        // MinIO answers 503 for a moment after it reports ready.
        let t0 = Instant::now();
        loop {
            match http_request(self.port, &req) {
                Some((200 | 201 | 409, _)) => return Ok(()),
                Some((503, _)) | None if t0.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                other => {
                    return Err(format!(
                        "creating {:?} container {name}: {other:?}",
                        self.kind
                    ));
                }
            }
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.resume();
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&k, msg).as_ref().to_vec()
}

/// The state letter of each thread of `pid` (`None` once it is gone).
fn thread_states(pid: u32) -> Option<Vec<char>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut states = Vec::new();
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread exited meanwhile
        };
        // `pid (comm) S ...`: comm may hold spaces or parentheses, so the
        // state is the first field after the last ')'.
        if let Some(state) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
        {
            states.push(state);
        }
    }
    Some(states)
}
