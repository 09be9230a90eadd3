//! Helpers shared by the binary's integration tests: `kvtier serve` on
//! ephemeral loopback ports, its readiness line, and its request counters;
//! cluster nodes in [`cluster`]; the CLI tests' server in [`cli`]; a server
//! with a disk tier, and the chains its fault tests write, in [`disk`].
#![allow(dead_code)]
pub mod cli;
pub mod cluster;
pub mod disk;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_kvtier");

/// `kvtier serve` with gRPC and HTTP on ephemeral loopback ports, printing
/// its bound addresses as one JSON line once it listens (`--ready-json`);
/// stdout is piped for [`ready`].
pub fn serve_command() -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ])
    .arg("--ready-json")
    .stdout(Stdio::piped());
    c
}

/// The readiness line of a server started with [`serve_command`]; `None` when
/// it exited (or closed stdout) before it was ready.
pub fn ready(child: &mut Child) -> Option<serde_json::Value> {
    let mut line = String::new();
    BufReader::new(child.stdout.take()?)
        .read_line(&mut line)
        .ok()?;
    serde_json::from_str(&line).ok()
}

/// Requests of `op` (`read`, `write`, …) answered so far, summed over APIs
/// and codes, from the server's `/metrics` at `http` (0 when unreachable).
pub fn requests_total(http: &str, op: &str) -> u64 {
    scrape(http, "kvtier_requests_total{", &[&format!("op=\"{op}\"")])
}

/// The sum of the samples whose line starts with `prefix` (a metric name and
/// `{`) and contains every one of `labels` (`name="value"`), from the
/// server's `/metrics` at `http` (0 when unreachable).
pub fn scrape(http: &str, prefix: &str, labels: &[&str]) -> u64 {
    scrape_signed(http, prefix, labels) as u64
}

/// [`scrape`] for a gauge that can be negative.
pub fn scrape_signed(http: &str, prefix: &str, labels: &[&str]) -> f64 {
    let Ok(mut s) = std::net::TcpStream::connect(http) else {
        return 0.0;
    };
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .filter(|l| l.starts_with(prefix) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>()
}

/// Builds the LD_PRELOAD interposer `tests/tools/{name}.c` into `dir` with
/// the system C compiler; returns the shared object's path.
pub fn interposer(name: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/tools/{name}.c"));
    let so = dir.join(format!("{name}.so"));
    let st = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("cc (a C compiler) is needed: apt-get install gcc");
    assert!(st.success(), "building {}", src.display());
    so
}
