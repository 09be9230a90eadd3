//! One measurement of one side: a fresh `kvtier serve` of that side's binary
//! on ephemeral loopback ports with that side's config and environment, the
//! generator (`kvtier bench --target`) against it, and the server's peak
//! resident memory (`VmHWM`, read before it is stopped).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::Record;

/// How one side runs: its server and its generator.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The server's binary.
    pub server: PathBuf,
    /// The generator's binary.
    pub generator: PathBuf,
    /// The server's `--config` file.
    pub config: PathBuf,
    /// Environment variables of the server.
    pub env: Vec<(String, String)>,
    /// `kvtier bench` arguments (the workload; `--target` and `--out` are added).
    pub bench_args: Vec<String>,
    /// `taskset -c` lists of the server and of the generator.
    pub server_cpus: Option<String>,
    /// See `server_cpus`.
    pub generator_cpus: Option<String>,
}

/// What one repeat of one side measured.
pub struct Outcome {
    /// The generator's record.
    pub record: Record,
    /// The server's peak resident memory, MiB.
    pub server_peak_rss_mib: Option<f64>,
}

fn command(cpus: &Option<String>, bin: &Path) -> Command {
    match cpus {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", c]).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

/// The effective configuration of `plan`'s server (`serve --print-config`):
/// refuses an unknown key or a bad value before anything is measured.
pub fn effective_config(plan: &Plan) -> anyhow::Result<String> {
    let out = Command::new(&plan.server)
        .args(["serve", "--print-config", "--config"])
        .arg(&plan.config)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .output()
        .with_context(|| format!("running {}", plan.server.display()))?;
    if !out.status.success() {
        bail!(
            "{} refuses the config {}: {}",
            plan.server.display(),
            plan.config.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs one repeat: server up, generator run into `dir`, server down.
pub fn measure(plan: &Plan, dir: &Path) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(dir)?;
    let log = std::fs::File::create(dir.join("server.log"))?;
    let mut server = command(&plan.server_cpus, &plan.server)
        .args(["serve", "--config"])
        .arg(&plan.config)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--ready-json",
        ])
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {} serve", plan.server.display()))?;
    let result = drive(plan, dir, &mut server);
    let peak = server_peak_rss_mib(server.id());
    stop(&mut server);
    let record = result?;
    Ok(Outcome {
        record,
        server_peak_rss_mib: peak,
    })
}

fn drive(plan: &Plan, dir: &Path, server: &mut Child) -> anyhow::Result<Record> {
    let mut line = String::new();
    let stdout = server.stdout.take().context("server stdout")?;
    BufReader::new(stdout).read_line(&mut line)?;
    let ready: serde_json::Value = serde_json::from_str(&line).with_context(|| {
        format!(
            "the server exited before it was ready; its log: {}",
            tail(&dir.join("server.log"))
        )
    })?;
    let grpc = ready["grpc"][0].as_str().context("no gRPC address")?;
    let out = dir.join("bench");
    let o = command(&plan.generator_cpus, &plan.generator)
        .args(["bench", "--target", &format!("grpc://{grpc}"), "--out"])
        .arg(&out)
        .args(&plan.bench_args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running the generator")?;
    if !o.status.success() {
        bail!(
            "{} bench {} failed: {}",
            plan.generator.display(),
            plan.bench_args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let path = out.join("record.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Record::from_json(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `VmHWM` of a process: the most memory it held resident at once.
fn server_peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((kib / 1024.0 * 10.0).round() / 10.0)
}

/// SIGTERM (a graceful shutdown), SIGKILL after 30 s.
fn stop(server: &mut Child) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(server.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = server.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = server.kill();
    let _ = server.wait();
}

fn tail(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
