//! The versioned perf record (`record.json`) that one `kvtier bench` run writes.
//!
//! A [`Record`] is the single source of truth for a run: `summary.md` and
//! `report.html` are rendered from it, and `kvtier bench compare` reads two of
//! them. The schema is documented in `docs/bench-record.md`; bump
//! [`SCHEMA_VERSION`] on any incompatible change.
//!
//! Latencies are microseconds (`f64`). Every percentile is read from an
//! HdrHistogram that was *merged* across processes and repeats — percentiles
//! are never averaged. Per-repeat figures are kept only to show the spread
//! (median, min, max) and to test significance in [`crate::analysis::compare`].
//!
//! The load generator builds steps with [`crate::builder::StepBuilder`] from
//! raw histograms; this module depends on no other module of the crate.
//!
//! This file holds the run's header ([`Record`], [`Machine`], the inputs of the
//! analysis), reading older schema versions, and the time / commit stamps.
//! The rest of the schema is in parts, all re-exported here:
//!
//! * `step`: load modes, latency phases, steps and their per-op results;
//! * `competitors`: competitor runs, their tools' references, network settings, link probe;
//! * `analysis`: the derived section [`Analysis`] and everything in it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod analysis;
mod competitors;
pub mod header;
mod step;

pub use analysis::{
    Analysis, CapacityPlan, CompetitorComparison, Degradation, DegradationRow, Knee, LittleCheck,
    Multipliers, OpUsl, Recommendation, Sla, Thresholds, UslFit,
};
pub use competitors::{CompetitorReference, CompetitorRun, LinkProbe, Network, ReferenceRow};
pub use step::{AcrossRepeats, Flag, Mode, OpStats, Percentiles, Phase, RepeatOp, Spread, Step};

/// Schema version of [`Record`]; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 2;

/// One bench run: what was measured, where, how, and the results.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// UTC start time, RFC 3339 (`2026-01-05T12:00:00Z`). With `commit`,
    /// `dirty`, `machine`, `command` and `versions`: the header every perf
    /// record starts with ([`header`]), in its order.
    pub date: String,
    /// HEAD of the checkout the run started in (40 hex digits), if known.
    #[serde(default)]
    pub commit: Option<String>,
    /// Whether that checkout's tracked files differed from `commit`.
    #[serde(default)]
    pub dirty: Option<bool>,
    /// The machine the generator ran on.
    pub machine: Machine,
    /// `command_line` shell-quoted, as the header writes it.
    #[serde(default)]
    pub command: Option<String>,
    /// kvtier's version and each competitor's (`redis`, `mooncake`).
    #[serde(default)]
    pub versions: BTreeMap<String, Option<String>>,
    /// Always [`SCHEMA_VERSION`] when written by this crate.
    pub schema_version: u32,
    /// `git rev-parse HEAD` of the binary's source tree, if known (the
    /// name before the header's `commit`; both are written).
    pub git_commit: Option<String>,
    /// The command line that produced the run, so it can be re-run.
    pub command_line: Vec<String>,
    /// Workload name (e.g. `seed-iteration`, `read-only`).
    pub workload: String,
    /// API / protocol exercised (e.g. `grpc`, `http`, `kvstore-compat`).
    pub api: String,
    /// Value (block) size in bytes.
    pub value_size: u64,
    /// Target address(es) of the system under test.
    pub target: String,
    /// The cluster driven through its node list (`--target a,b,c`), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterTarget>,
    /// Inputs of the analysis: SLAs, capacity target, thresholds.
    #[serde(default)]
    pub analysis_config: AnalysisConfig,
    /// One entry per load level (closed concurrency or open rate), in run order.
    pub steps: Vec<Step>,
    /// Competitor systems (Redis, Mooncake Store) measured in the same run with the
    /// same steps, repeats alternating with kvtier's. Named `peers` in the
    /// record, the name readers of notes/*.json use.
    #[serde(default, rename = "peers")]
    pub competitors: Vec<CompetitorRun>,
    /// Raw TCP throughput between generator and target, measured in the same run.
    #[serde(default)]
    pub link_probe: Option<LinkProbe>,
    /// The network settings every system ran under (comparison rule 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Derived results; filled by [`crate::analysis::analyze`].
    #[serde(default)]
    pub analysis: Option<Analysis>,
}

impl Record {
    /// A record stamped with the current UTC time, schema version and this machine.
    pub fn new(workload: &str, api: &str, value_size: u64, target: &str) -> Self {
        let (commit, dirty) = header::git_state(std::path::Path::new("."));
        Record {
            date: rfc3339_now(),
            commit,
            dirty,
            machine: Machine::detect(),
            command: Some(header::shell_join(std::env::args())),
            versions: header::kvtier_version(),
            schema_version: SCHEMA_VERSION,
            git_commit: None,
            command_line: std::env::args().collect(),
            workload: workload.to_string(),
            api: api.to_string(),
            value_size,
            target: target.to_string(),
            cluster: None,
            analysis_config: AnalysisConfig::default(),
            steps: Vec::new(),
            competitors: Vec::new(),
            link_probe: None,
            network: None,
            analysis: None,
        }
    }

    /// Parses a record, rejecting unknown schema versions. Version 1 (one
    /// `peer` and a separate `peer_reference`) is read as version 2 with
    /// that competitor first in `peers` and the reference attached to it.
    pub fn from_json(text: &str) -> anyhow::Result<Self> {
        let mut v: serde_json::Value = serde_json::from_str(text)?;
        let version = v.get("schema_version").and_then(|x| x.as_u64());
        match version {
            Some(1) => upgrade_v1(&mut v),
            Some(x) if x == u64::from(SCHEMA_VERSION) => {}
            _ => anyhow::bail!(
                "record schema_version {version:?} is not supported (expected 1 or {SCHEMA_VERSION})"
            ),
        }
        Ok(serde_json::from_value(v)?)
    }

    /// The competitor run named `name` (e.g. `redis 7.0.15`), if any.
    pub fn competitor(&self, name: &str) -> Option<&CompetitorRun> {
        self.competitors.iter().find(|p| p.name == name)
    }
}

/// Version 1 → 2: `peer` + `peer_reference` become `peers[0]` (+ its
/// `reference`). The record keeps the field names "peer"/"peers" for
/// competitors (docs/architecture.md, Glossary).
fn upgrade_v1(v: &mut serde_json::Value) {
    let Some(o) = v.as_object_mut() else { return };
    let reference = o.remove("peer_reference").filter(|r| !r.is_null());
    let competitors = match o.remove("peer").filter(|p| !p.is_null()) {
        Some(mut p) => {
            if let (Some(po), Some(r)) = (p.as_object_mut(), reference) {
                po.insert("reference".into(), r);
            }
            vec![p]
        }
        None => Vec::new(),
    };
    o.insert("peers".into(), serde_json::Value::Array(competitors));
    o.insert("schema_version".into(), SCHEMA_VERSION.into());
}

/// A cluster a run drove through its node list: each block sent to an owner
/// by the Rust client's `ClusterClient`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterTarget {
    /// The nodes' addresses, in the order given.
    pub nodes: Vec<String>,
    /// Owners per block the client placed requests with.
    pub replicas: usize,
}

/// Inputs to the analysis that come from the command line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct AnalysisConfig {
    /// SLA strings such as `read.p99=100ms`, see [`crate::analysis::sla::parse_slas`].
    #[serde(default)]
    pub slas: Vec<String>,
    /// Capacity planning target in tokens/s (all servers together).
    #[serde(default)]
    pub target_tokens_per_s: Option<f64>,
    /// Tolerances of the self-checks; defaults when absent.
    #[serde(default)]
    pub thresholds: Option<Thresholds>,
}

/// The machine the generator ran on, with the keys of the perf header's
/// `machine` (perf/README.md); the optional ones are absent from records
/// written before the header.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Machine {
    /// CPU model (`/proc/cpuinfo`'s `model name`).
    #[serde(default)]
    pub cpu_model: Option<String>,
    /// Logical cores available to the process (its CPU affinity).
    pub cores: u32,
    /// Logical cores of the machine (online CPUs).
    #[serde(default)]
    pub cores_online: Option<u32>,
    /// Total memory in GiB, one decimal.
    #[serde(default)]
    pub memory_gib: Option<f64>,
    /// Total memory in bytes (from `/proc/meminfo`), 0 if unknown.
    pub memory_bytes: u64,
    /// Host name.
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// The system's TCP congestion control.
    #[serde(default)]
    pub congestion_control: Option<String>,
}

impl Machine {
    /// Reads cores, memory, hostname and kernel of this (Linux) machine; unknowns are empty.
    pub fn detect() -> Self {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let memory_bytes = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024);
        let some = |s: String| (!s.is_empty()).then_some(s);
        let cpuinfo = read("/proc/cpuinfo");
        Machine {
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, m)| m.trim().to_string()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            cores_online: Some(
                cpuinfo
                    .lines()
                    .filter(|l| l.starts_with("processor"))
                    .count() as u32,
            )
            .filter(|n| *n > 0),
            memory_gib: (memory_bytes > 0)
                .then(|| (memory_bytes as f64 / (1u64 << 30) as f64 * 10.0).round() / 10.0),
            memory_bytes,
            hostname: read("/proc/sys/kernel/hostname"),
            kernel: read("/proc/sys/kernel/osrelease"),
            congestion_control: some(read("/proc/sys/net/ipv4/tcp_congestion_control")),
        }
    }
}

/// `git rev-parse HEAD` in the current directory (read-only), if git and a repository are there.
pub fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// Current UTC time as RFC 3339 with second precision.
pub fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    rfc3339(secs)
}

/// Formats Unix seconds as RFC 3339 UTC.
pub fn rfc3339(unix_secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(unix_secs))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_767_614_400), "2026-01-05T12:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn schema_version_checked() {
        let r = Record::new("w", "grpc", 1, "t");
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(Record::from_json(&text).unwrap(), r);
        let bad = text.replace("\"schema_version\":2", "\"schema_version\":99");
        assert_ne!(bad, text);
        assert!(Record::from_json(&bad).is_err());
    }

    #[test]
    fn a_version_1_record_reads_with_its_competitor_and_reference_attached() {
        let mut v: serde_json::Value =
            serde_json::to_value(Record::new("read", "grpc", 1, "t")).unwrap();
        let o = v.as_object_mut().unwrap();
        o.insert("schema_version".into(), 1.into());
        o.remove("peers");
        o.insert(
            "peer".into(),
            serde_json::json!({"name": "redis 7", "op_map": {"read": "get"}, "steps": []}),
        );
        o.insert(
            "peer_reference".into(),
            serde_json::json!({"tool": "redis-benchmark", "rows": [
                {"concurrency": 8, "op": "get", "throughput_ops_s": 5.0, "p50_us": 1.0, "p99_us": 2.0}]}),
        );
        let r = Record::from_json(&v.to_string()).unwrap();
        assert_eq!(r.schema_version, SCHEMA_VERSION);
        assert_eq!(r.competitors.len(), 1);
        assert_eq!(r.competitors[0].name, "redis 7");
        let rf = r.competitors[0]
            .reference
            .as_ref()
            .expect("reference moved onto the competitor");
        assert_eq!(rf.rows[0].throughput_ops_s, 5.0);
        assert_eq!(rf.rows[0].generator_cpu_utilisation, None);
    }
}
