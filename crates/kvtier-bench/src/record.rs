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

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Schema version of [`Record`]; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 2;

/// One bench run: what was measured, where, how, and the results.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// Always [`SCHEMA_VERSION`] when written by this crate.
    pub schema_version: u32,
    /// UTC start time, RFC 3339 (`2026-01-05T12:00:00Z`).
    pub date: String,
    /// `git rev-parse HEAD` of the binary's source tree, if known.
    pub git_commit: Option<String>,
    /// The machine the generator ran on.
    pub machine: Machine,
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
    /// Inputs of the analysis: SLAs, capacity target, thresholds.
    #[serde(default)]
    pub analysis_config: AnalysisConfig,
    /// One entry per load level (closed concurrency or open rate), in run order.
    pub steps: Vec<Step>,
    /// Peer systems (Redis, Mooncake Store) measured in the same run with the
    /// same steps, repeats alternating with kvtier's.
    #[serde(default)]
    pub peers: Vec<PeerRun>,
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
        Record {
            schema_version: SCHEMA_VERSION,
            date: rfc3339_now(),
            git_commit: None,
            machine: Machine::detect(),
            command_line: std::env::args().collect(),
            workload: workload.to_string(),
            api: api.to_string(),
            value_size,
            target: target.to_string(),
            analysis_config: AnalysisConfig::default(),
            steps: Vec::new(),
            peers: Vec::new(),
            link_probe: None,
            network: None,
            analysis: None,
        }
    }

    /// Parses a record, rejecting unknown schema versions. Version 1 (one
    /// `peer` and a separate `peer_reference`) is read as version 2 with
    /// that peer first in `peers` and the reference attached to it.
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

    /// The peer run named `name` (e.g. `redis 7.0.15`), if any.
    pub fn peer(&self, name: &str) -> Option<&PeerRun> {
        self.peers.iter().find(|p| p.name == name)
    }
}

/// Version 1 → 2: `peer` + `peer_reference` become `peers[0]` (+ its `reference`).
fn upgrade_v1(v: &mut serde_json::Value) {
    let Some(o) = v.as_object_mut() else { return };
    let reference = o.remove("peer_reference").filter(|r| !r.is_null());
    let peers = match o.remove("peer").filter(|p| !p.is_null()) {
        Some(mut p) => {
            if let (Some(po), Some(r)) = (p.as_object_mut(), reference) {
                po.insert("reference".into(), r);
            }
            vec![p]
        }
        None => Vec::new(),
    };
    o.insert("peers".into(), serde_json::Value::Array(peers));
    o.insert("schema_version".into(), SCHEMA_VERSION.into());
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

/// The machine the generator ran on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Machine {
    /// Logical cores available to the process.
    pub cores: u32,
    /// Total memory in bytes (from `/proc/meminfo`), 0 if unknown.
    pub memory_bytes: u64,
    /// Host name.
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
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
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            memory_bytes,
            hostname: read("/proc/sys/kernel/hostname"),
            kernel: read("/proc/sys/kernel/osrelease"),
        }
    }
}

/// How load was applied in a step.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mode {
    /// Closed loop: `concurrency` workers per process, each issuing the next request when the previous completes.
    Closed {
        /// Workers per process.
        concurrency: u32,
    },
    /// Open loop: requests are scheduled at a fixed total rate; latency counts from the intended start.
    Open {
        /// Intended request starts per second, all processes together.
        rate_per_s: f64,
    },
}

/// Latency phases measured per request (see the measurement contract in ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// End to end; in open loop from the intended start (coordinated-omission corrected).
    E2e,
    /// Intended start → request sent (generator / connection queueing).
    ClientQueue,
    /// Server: accepted → started.
    ServerQueue,
    /// Server: started → done.
    ServerService,
    /// Server time spent in storage tiers.
    Storage,
    /// Network / transport: end to end − server total.
    Network,
}

impl Phase {
    /// All phases, in display order.
    pub const ALL: [Phase; 6] = [
        Phase::E2e,
        Phase::ClientQueue,
        Phase::ServerQueue,
        Phase::ServerService,
        Phase::Storage,
        Phase::Network,
    ];

    /// The snake_case name used in JSON and SLA strings.
    pub fn name(self) -> &'static str {
        match self {
            Phase::E2e => "e2e",
            Phase::ClientQueue => "client_queue",
            Phase::ServerQueue => "server_queue",
            Phase::ServerService => "server_service",
            Phase::Storage => "storage",
            Phase::Network => "network",
        }
    }

    /// Inverse of [`Phase::name`].
    pub fn from_name(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Percentiles of one merged histogram, microseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct Percentiles {
    /// Samples in the histogram.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Percentiles {
    /// Reads the percentiles of a histogram of microseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        let q = |x: f64| h.value_at_quantile(x) as f64;
        Percentiles {
            count: h.len(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            max: h.max() as f64,
            mean: h.mean(),
        }
    }

    /// A statistic by name: `p50`, `p90`, `p99`, `p999`, `max`, `mean`.
    pub fn get(&self, stat: &str) -> Option<f64> {
        Some(match stat {
            "p50" => self.p50,
            "p90" => self.p90,
            "p99" => self.p99,
            "p999" => self.p999,
            "max" => self.max,
            "mean" => self.mean,
            _ => return None,
        })
    }
}

/// Median and range of one figure across repeats.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct Spread {
    /// Median of the per-repeat values.
    pub median: f64,
    /// Smallest per-repeat value.
    pub min: f64,
    /// Largest per-repeat value.
    pub max: f64,
}

impl Spread {
    /// Median / min / max of `values` (all zero when empty).
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Spread::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// A step or run marked as suspicious; flagged data is shown, never silently used.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Flag {
    /// Machine-readable kind, e.g. `littles_law`, `client_cpu`, `schedule_lag`,
    /// `latency_fell`, `errors`, or a generator-defined kind.
    pub kind: String,
    /// Human-readable explanation with the numbers that triggered it.
    pub message: String,
}

/// One load level, merged across processes and repeats.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Step {
    /// Closed concurrency or open rate.
    pub mode: Mode,
    /// Generator processes; closed-loop total concurrency is `processes × concurrency`.
    pub processes: u32,
    /// Number of repeats merged into this step.
    pub repeats: u32,
    /// Measured wall time summed over repeats, seconds (warm-up excluded).
    pub duration_s: f64,
    /// Generator CPU time / (wall time × cores available), 0..1.
    pub generator_cpu_utilisation: f64,
    /// Cores available to the generator.
    pub generator_cores: u32,
    /// Open loop: intended start → actual send, all ops merged.
    #[serde(default)]
    pub schedule_lag: Option<Percentiles>,
    /// Open loop: mean requests in flight if the generator sampled it (for Little's law).
    #[serde(default)]
    pub mean_in_flight: Option<f64>,
    /// Per operation (`lookup`, `read`, `write`, `get`, `set`, ...).
    pub ops: BTreeMap<String, OpStats>,
    /// Checks that failed for this step.
    #[serde(default)]
    pub flags: Vec<Flag>,
}

impl Step {
    /// Closed loop: processes × concurrency; open loop: `None`.
    pub fn total_concurrency(&self) -> Option<u32> {
        match self.mode {
            Mode::Closed { concurrency } => Some(concurrency * self.processes),
            Mode::Open { .. } => None,
        }
    }

    /// Short label such as `c=32 (8×4)` or `rate=500/s`.
    pub fn label(&self) -> String {
        match self.mode {
            Mode::Closed { concurrency } if self.processes > 1 => {
                format!(
                    "c={} ({}×{})",
                    concurrency * self.processes,
                    self.processes,
                    concurrency
                )
            }
            Mode::Closed { concurrency } => format!("c={concurrency}"),
            Mode::Open { rate_per_s } => format!("rate={rate_per_s}/s"),
        }
    }

    /// Load-level key, the x value of charts: total concurrency or rate.
    pub fn load(&self) -> f64 {
        match self.mode {
            Mode::Closed { concurrency } => f64::from(concurrency * self.processes),
            Mode::Open { rate_per_s } => rate_per_s,
        }
    }

    /// Throughput of all ops together, ops/s.
    pub fn total_throughput(&self) -> f64 {
        self.ops.values().map(|o| o.throughput_ops_s).sum()
    }

    /// Tokens/s of all ops together.
    pub fn total_tokens_per_s(&self) -> f64 {
        self.ops.values().map(|o| o.tokens_per_s).sum()
    }

    /// Bytes/s of all ops together.
    pub fn total_bytes_per_s(&self) -> f64 {
        self.ops.values().map(|o| o.bytes_per_s).sum()
    }
}

/// Results of one operation in one step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct OpStats {
    /// Completed operations (errors included).
    pub ops: u64,
    /// Failed operations.
    pub errors: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Tokens covered by the moved blocks.
    pub tokens: u64,
    /// ops / duration.
    pub throughput_ops_s: f64,
    /// tokens / duration.
    pub tokens_per_s: f64,
    /// bytes / duration.
    pub bytes_per_s: f64,
    /// Percentiles per phase from merged histograms; `e2e` is corrected in open loop.
    pub latency_us: BTreeMap<Phase, Percentiles>,
    /// Open loop only: end to end from the actual send (not corrected), for comparison.
    #[serde(default)]
    pub e2e_uncorrected_us: Option<Percentiles>,
    /// One entry per repeat, in repeat order (used for spread and significance).
    #[serde(default)]
    pub per_repeat: Vec<RepeatOp>,
    /// Median and range across repeats of throughput and e2e percentiles (≥ 2 repeats).
    #[serde(default)]
    pub across_repeats: Option<AcrossRepeats>,
}

impl OpStats {
    /// Percentiles of one phase, if measured.
    pub fn phase(&self, p: Phase) -> Option<&Percentiles> {
        self.latency_us.get(&p)
    }
}

/// One operation in one repeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct RepeatOp {
    /// Repeat index, 0-based.
    pub repeat: u32,
    /// ops/s in this repeat.
    pub throughput_ops_s: f64,
    /// End-to-end percentiles of this repeat alone.
    pub e2e_us: Percentiles,
}

/// Spread across repeats of one operation's headline figures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct AcrossRepeats {
    /// ops/s.
    pub throughput_ops_s: Spread,
    /// e2e p50, µs.
    pub p50_us: Spread,
    /// e2e p99, µs.
    pub p99_us: Spread,
    /// e2e p999, µs.
    pub p999_us: Spread,
}

/// A peer system measured with the same steps in the same run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct PeerRun {
    /// e.g. `redis 7.0.15`, `mooncake-store 0.3.13.post1`.
    pub name: String,
    /// How the steps were driven, e.g. `kvtier bench RESP2 client`.
    #[serde(default)]
    pub client: String,
    /// kvtier op → peer op used for ratio tables, e.g. `read → get`.
    #[serde(default)]
    pub op_map: BTreeMap<String, String>,
    /// Steps, same structure as [`Record::steps`].
    pub steps: Vec<Step>,
    /// The peer's own benchmark tool, run against it in the same run (e.g.
    /// `redis-benchmark`): comparisons use the better of it and `steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<PeerReference>,
}

/// Congestion control of the sockets each system used, sampled with `ss`
/// while it was under load (both ends of each connection seen on this host).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Network {
    /// `net.ipv4.tcp_congestion_control` when the run started.
    pub system_default_cc: String,
    /// What kvtier's bench client asked for on data-plane sockets ("": system default).
    pub kvtier_client_cc: String,
    /// System (`kvtier`, or a peer's name) → congestion control names seen on its sockets.
    pub observed_cc: BTreeMap<String, std::collections::BTreeSet<String>>,
}

impl Network {
    /// Why the run's network settings were not equal between kvtier and `peer`, if they were not.
    pub fn unequal(&self, peer: &str) -> Option<String> {
        let k = self.observed_cc.get("kvtier")?;
        let p = self.observed_cc.get(peer)?;
        (k != p).then(|| {
            let j = |s: &std::collections::BTreeSet<String>| {
                s.iter().cloned().collect::<Vec<_>>().join("+")
            };
            format!(
                "unequal congestion control: kvtier {}, {peer} {}",
                j(k),
                j(p)
            )
        })
    }
}

/// The peer's own benchmark tool, run in the same run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct PeerReference {
    /// The command, with `{c}` for the concurrency.
    pub tool: String,
    /// One row per (concurrency, op).
    pub rows: Vec<ReferenceRow>,
}

/// One result line of the peer's benchmark tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ReferenceRow {
    /// Connections (closed loop).
    pub concurrency: u32,
    /// Peer op (`get`, `set`).
    pub op: String,
    /// Requests per second.
    pub throughput_ops_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// The tool's CPU time / (wall time × its threads), when measured: near 1
    /// the tool itself, not the peer, may be the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_cpu_utilisation: Option<f64>,
}

/// Raw TCP throughput between generator and target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct LinkProbe {
    /// Measured throughput, Gbit/s.
    pub gbit_per_s: f64,
    /// Parallel TCP streams.
    pub streams: u32,
    /// Probe duration, seconds.
    pub duration_s: f64,
    /// How it was measured.
    pub method: String,
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
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// The analysis section, computed by crate::analysis, crate::analysis::sla and
// crate::analysis::usl; its schema lives here with the rest of the record.

/// Tolerances of the self-checks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Thresholds {
    /// Little's law: flag when |X·W / N − 1| exceeds this (0.10 = 10 %).
    pub littles_law_tolerance: f64,
    /// Flag when generator CPU / (wall × cores) exceeds this.
    pub client_cpu_max: f64,
    /// Open loop: flag when the schedule lag p99 exceeds this many µs.
    pub schedule_lag_p99_us: f64,
    /// Flag when p50 falls by more than this fraction vs the next lower load.
    pub latency_fall_tolerance: f64,
}

/// Little's law at one step: in-flight = throughput × mean latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LittleCheck {
    /// Step label.
    pub step: String,
    /// Concurrency (closed) or measured mean in-flight (open); `None` in open loop without a sample.
    pub expected_in_flight: Option<f64>,
    /// Σ over ops of throughput × mean e2e latency.
    pub predicted_in_flight: f64,
    /// predicted / expected.
    pub ratio: Option<f64>,
    /// Within tolerance (or not checkable).
    pub ok: bool,
}

/// A knee found on one curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    /// Op name, or `all` for the total throughput.
    pub op: String,
    /// `throughput`, `p50` or `p99`.
    pub curve: String,
    /// Total concurrency at the knee.
    pub concurrency: f64,
    /// Curve value there (ops/s or µs).
    pub value: f64,
}

/// USL fit of one op's (or `all` ops') throughput vs total concurrency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpUsl {
    /// Op name or `all`.
    pub op: String,
    /// The fit.
    pub fit: UslFit,
}

/// p50 / p99 multipliers of one phase vs the baseline step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Multipliers {
    /// p50 / baseline p50.
    pub p50: f64,
    /// p99 / baseline p99.
    pub p99: f64,
}

/// One row of a degradation table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DegradationRow {
    /// Step label.
    pub step: String,
    /// Total concurrency.
    pub concurrency: f64,
    /// Per phase.
    pub phases: BTreeMap<Phase, Multipliers>,
    /// The step carries flags.
    pub flagged: bool,
}

/// Latency growth of one op vs the lowest-concurrency step (seed 000's tables).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Degradation {
    /// Op name.
    pub op: String,
    /// Total concurrency of the baseline step (1 in a full sweep).
    pub baseline_concurrency: f64,
    /// One row per closed-loop step, by concurrency.
    pub rows: Vec<DegradationRow>,
}

/// Everything [`analyze`] derives from a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Analysis {
    /// Tolerances used.
    pub thresholds: Thresholds,
    /// Little's law per step.
    pub littles_law: Vec<LittleCheck>,
    /// Knees of latency and throughput vs concurrency.
    pub knees: Vec<Knee>,
    /// USL fits per op and for all ops.
    pub usl: Vec<OpUsl>,
    /// Degradation multipliers per op.
    pub degradation: Vec<Degradation>,
    /// Recommended maximum load per SLA.
    pub recommendations: Vec<Recommendation>,
    /// Servers needed per SLA for the capacity target.
    pub capacity: Vec<CapacityPlan>,
    /// Problems met while analysing (bad SLA strings, too few points, ...).
    pub warnings: Vec<String>,
    /// kvtier vs each peer under the comparison rules ([`crate::analysis::fair`]).
    #[serde(default)]
    pub comparison: Vec<PeerComparison>,
}

/// One (step, kvtier op, peer) comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PeerComparison {
    /// Step label (`c=8`).
    pub step: String,
    /// Total concurrency (closed loop) or rate.
    pub load: f64,
    /// kvtier op (`read`).
    pub op: String,
    /// Peer name (`redis 7.0.15`).
    pub peer: String,
    /// Peer op (`get`).
    pub peer_op: String,
    /// kvtier ops/s, median over repeats.
    pub kvtier_ops_s: f64,
    /// kvtier ops/s of each repeat.
    pub kvtier_repeats_ops_s: Vec<f64>,
    /// kvtier e2e p99 (µs), median over repeats.
    pub kvtier_p99_us: f64,
    /// The bench's client of the peer: ops/s, median over repeats.
    pub peer_client_ops_s: Option<f64>,
    /// The bench's client of the peer: ops/s of each repeat.
    pub peer_client_repeats_ops_s: Vec<f64>,
    /// The bench's client of the peer: e2e p99 (µs), median over repeats.
    pub peer_client_p99_us: Option<f64>,
    /// The peer's own tool: ops/s.
    pub peer_tool_ops_s: Option<f64>,
    /// The peer's own tool: p99 (µs).
    pub peer_tool_p99_us: Option<f64>,
    /// The peer's best ops/s (rule 2), the ratio's denominator.
    pub peer_best_ops_s: f64,
    /// p99 (µs) of the source that gave the best ops/s.
    pub peer_best_p99_us: f64,
    /// `client` or `tool`.
    pub peer_best_source: String,
    /// kvtier / peer best ops/s; `None` when excluded.
    pub throughput_ratio: Option<f64>,
    /// kvtier p99 / peer best source's p99; `None` when excluded.
    pub p99_ratio: Option<f64>,
    /// Why no ratio is given (empty: included).
    pub excluded: Vec<String>,
    /// Repeats far from their median, kept in the medians but reported here.
    pub outliers: Vec<String>,
}

/// One latency constraint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sla {
    /// Operation name (`read`, `lookup`, ...).
    pub op: String,
    /// Phase, `e2e` unless given.
    pub phase: Phase,
    /// `p50`, `p90`, `p99`, `p999`, `max` or `mean`.
    pub stat: String,
    /// Upper bound in microseconds (a step meets it when its value is ≤ this).
    pub limit_us: f64,
}

/// Largest load that meets a set of constraints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// The constraints, as text.
    pub sla: String,
    /// `closed` (concurrency) or `open` (rate).
    pub mode: String,
    /// Step label of the recommended point, `None` if no step meets the SLA.
    pub step: Option<String>,
    /// Total concurrency (closed) or rate (open) of that step.
    pub load: Option<f64>,
    /// Throughput of all ops there, ops/s.
    pub throughput_ops_s: Option<f64>,
    /// Tokens/s of all ops there.
    pub tokens_per_s: Option<f64>,
    /// The measured values of the constraints there, µs (same order as the constraints).
    pub measured_us: Vec<f64>,
    /// The step carries flags: the recommendation rests on suspicious data.
    pub flagged: bool,
}

/// Servers needed for a target throughput at an SLA (seed 001's scaling formula).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityPlan {
    /// The constraints, as text.
    pub sla: String,
    /// Target tokens/s, all servers together.
    pub target_tokens_per_s: f64,
    /// Tokens/s one server sustains within the SLA (the recommended step).
    pub per_server_tokens_per_s: f64,
    /// Load per server at that point (concurrency or rate).
    pub per_server_load: f64,
    /// `ceil(target / per_server)`.
    pub servers_needed: u64,
}

/// Fitted USL parameters.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct UslFit {
    /// Throughput of one unit of concurrency without contention (ops/s).
    pub lambda: f64,
    /// Contention (serial fraction), ≥ 0.
    pub sigma: f64,
    /// Coherency (crosstalk), ≥ 0.
    pub kappa: f64,
    /// Concurrency of peak throughput `sqrt((1−σ)/κ)`; `None` when κ = 0 or σ ≥ 1.
    pub peak_concurrency: Option<f64>,
    /// Predicted throughput at the peak (or the asymptote λ/σ when there is none).
    pub peak_throughput: Option<f64>,
    /// Coefficient of determination on the input points.
    pub r_squared: f64,
    /// Number of points fitted.
    pub points: usize,
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
    fn spread_median_even_and_odd() {
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0]),
            Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            }
        );
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
    }

    #[test]
    fn percentiles_from_histogram() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000 {
            h.record(v).unwrap();
        }
        let p = Percentiles::from_histogram(&h);
        assert_eq!(p.count, 1000);
        assert!((p.p50 - 500.0).abs() <= 1.0, "{p:?}");
        assert!((p.p99 - 990.0).abs() <= 1.0, "{p:?}");
        assert!((p.mean - 500.5).abs() < 1.0);
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
    fn a_version_1_record_reads_with_its_peer_and_reference_attached() {
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
        assert_eq!(r.peers.len(), 1);
        assert_eq!(r.peers[0].name, "redis 7");
        let rf = r.peers[0]
            .reference
            .as_ref()
            .expect("reference moved onto the peer");
        assert_eq!(rf.rows[0].throughput_ops_s, 5.0);
        assert_eq!(rf.rows[0].generator_cpu_utilisation, None);
    }
}
