//! The Mooncake Store competitor (`--competitor mooncake://spawn`): the store kvtier's
//! users would otherwise pick (vLLM's `MooncakeStoreConnector`, LMCache's
//! `mooncakestore://`, SGLang HiCache), measured with the same value size and
//! concurrency in the same run.
//!
//! Mooncake is driven through its own Python API, from processes separate
//! from the ones holding its memory, so data crosses TCP as it does for
//! kvtier and Redis. The driver is `mooncake_driver.py` (embedded here,
//! written to a temp dir at run time) executed by the Python of
//! `.tools/mooncake` (`scripts/setup-mooncake.sh`) or `$KVTIER_MOONCAKE_PYTHON`:
//!
//! * `cluster --mem BYTES --ready-file F` starts `mooncake_master` and a
//!   process contributing a BYTES memory segment (the store's capacity, like
//!   Redis's `maxmemory`), writes their addresses to F, and stops them when
//!   its stdin closes;
//! * `run --op put|get --concurrency C …` runs a closed-loop load and prints
//!   every measured latency, its error count and its CPU time as JSON.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;

use crate::builder::{OpInput, RepeatInput};
use crate::load::cores;
use crate::record::{CompetitorReference, Phase, ReferenceRow};

/// The driver script.
pub const DRIVER: &str = include_str!("mooncake_driver.py");

/// The Python that has Mooncake installed.
pub fn python() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVTIER_MOONCAKE_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    let p = PathBuf::from(".tools/mooncake/bin/python");
    anyhow::ensure!(
        p.exists(),
        "Mooncake Store is not installed: run scripts/setup-mooncake.sh from the repository root \
         (or set KVTIER_MOONCAKE_PYTHON to a Python that imports mooncake)"
    );
    Ok(p)
}

/// Addresses of a running Mooncake cluster, as the driver's `cluster` reports them.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterInfo {
    /// `127.0.0.1:PORT` of `mooncake_master`.
    pub master: String,
    /// Metadata server the clients use.
    pub metadata: String,
    /// Processes of the cluster (master, segment holder).
    #[serde(default)]
    pub pids: Vec<u32>,
    /// Mooncake's package version.
    #[serde(default)]
    pub version: String,
}

/// A Mooncake cluster this run started; stopped on drop.
pub struct SpawnedMooncake {
    child: Child,
    python: PathBuf,
    dir: tempfile::TempDir,
    /// Its addresses.
    pub info: ClusterInfo,
}

/// The driver's `run` output.
#[derive(Debug, Deserialize)]
struct RunOut {
    #[serde(default)]
    api: String,
    #[serde(default)]
    workers: String,
    duration_s: f64,
    ops: u64,
    errors: u64,
    #[serde(default)]
    error_samples: Vec<String>,
    latencies_us: Vec<u64>,
    generator_cpu_s: f64,
}

#[derive(Debug, Deserialize)]
struct ReferenceOut {
    tool: String,
    rows: Vec<ReferenceRow>,
}

impl SpawnedMooncake {
    /// Starts a cluster whose store holds `mem` bytes, on the CPUs `cpus`
    /// (a `taskset -c` list) when given; waits until it answers.
    pub fn start(mem: u64, cpus: Option<&str>) -> anyhow::Result<Self> {
        let python = python()?;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("mooncake_driver.py"), DRIVER)?;
        let ready = dir.path().join("ready.json");
        let mut child = crate::competitors::redis::pinned(cpus, &python)
            .arg(dir.path().join("mooncake_driver.py"))
            .args(["cluster", "--mem", &mem.to_string(), "--ready-file"])
            .arg(&ready)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} (Mooncake driver)", python.display()))?;
        let deadline = Instant::now() + Duration::from_secs(90);
        let info = loop {
            if let Ok(text) = std::fs::read_to_string(&ready)
                && let Ok(info) = serde_json::from_str::<ClusterInfo>(&text)
            {
                break info;
            }
            if let Some(st) = child.try_wait()? {
                anyhow::bail!("the Mooncake cluster exited before it was ready: {st}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("the Mooncake cluster was not ready within 90 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Ok(SpawnedMooncake {
            child,
            python,
            dir,
            info,
        })
    }

    /// `mooncake-store VERSION`.
    pub fn name(&self) -> String {
        format!("mooncake-store {}", self.info.version)
            .trim()
            .to_string()
    }

    fn driver(&self) -> Command {
        let mut c = Command::new(&self.python);
        c.arg(self.dir.path().join("mooncake_driver.py"));
        c
    }

    /// Runs `op` (`put` / `get`) at `concurrency` for `warmup` + `duration`;
    /// `on_start` gets the driver's process id (for [`crate::netobs`]).
    /// Returns the repeat and how it was driven (API, threads or processes).
    pub fn run(
        &self,
        op: &str,
        concurrency: u32,
        warmup: Duration,
        duration: Duration,
        value_size: usize,
        on_start: impl FnOnce(u32),
    ) -> anyhow::Result<(RepeatInput, String)> {
        let child = self
            .driver()
            .args(["run", "--master", &self.info.master])
            .args(["--metadata", &self.info.metadata, "--op", op])
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--duration", &format!("{:.3}", duration.as_secs_f64())])
            .args(["--warmup", &format!("{:.3}", warmup.as_secs_f64())])
            .args(["--value-size", &value_size.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the Mooncake driver")?;
        on_start(child.id());
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "Mooncake driver `run --op {op}` failed: {}",
            out.status
        );
        let r: RunOut = serde_json::from_slice(&out.stdout).context("Mooncake driver output")?;
        if r.errors > 0 {
            eprintln!(
                "warning: mooncake {op}: {} of {} failed, e.g. {:?}",
                r.errors,
                r.ops,
                r.error_samples.first()
            );
        }
        let mut o = OpInput {
            ops: r.ops,
            errors: r.errors,
            bytes: r.ops.saturating_sub(r.errors) * value_size as u64,
            ..Default::default()
        };
        for l in &r.latencies_us {
            o.record(Phase::E2e, *l);
        }
        let input = RepeatInput {
            duration: Duration::from_secs_f64(r.duration_s),
            generator_cpu: Duration::from_secs_f64(r.generator_cpu_s),
            generator_cores: cores(),
            ops: [(op.to_string(), o)].into(),
            ..Default::default()
        };
        let how = format!(
            "Mooncake's Python API (`{}`), {} worker {}, from kvtier bench's Mooncake driver",
            r.api, concurrency, r.workers
        );
        Ok((input, how))
    }

    /// Mooncake's own benchmark tool, if the driver found one.
    pub fn reference(
        &self,
        concurrency: &[u32],
        duration: Duration,
        value_size: usize,
    ) -> anyhow::Result<Option<CompetitorReference>> {
        let mut tool = None;
        let mut rows = Vec::new();
        for &c in concurrency {
            let out = self
                .driver()
                .args(["reference", "--master", &self.info.master])
                .args(["--metadata", &self.info.metadata])
                .args(["--concurrency", &c.to_string()])
                .args(["--value-size", &value_size.to_string()])
                .args(["--duration", &format!("{:.3}", duration.as_secs_f64())])
                .stderr(Stdio::inherit())
                .output()?;
            if !out.status.success() {
                return Ok(None);
            }
            let r: ReferenceOut =
                serde_json::from_slice(&out.stdout).context("Mooncake reference output")?;
            tool = Some(r.tool);
            rows.extend(r.rows);
        }
        Ok(tool.map(|tool| CompetitorReference { tool, rows }))
    }
}

impl Drop for SpawnedMooncake {
    fn drop(&mut self) {
        // Closing stdin asks the driver to stop what it started.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `path` is an executable Python that imports `mooncake`.
pub fn available(path: &Path) -> bool {
    Command::new(path)
        .args(["-c", "import mooncake.store"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
