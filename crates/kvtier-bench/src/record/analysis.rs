//! The record's analysis section: what `crate::analysis` (with its `sla`,
//! `usl` and `fair` parts) derives from the measured steps — self-checks,
//! knees, USL fits, degradation tables, SLA recommendations, capacity plans
//! and the comparisons with competitors.
//!
//! The schema lives with the rest of the record so that `record` depends on no
//! other module of the crate; the code that computes it does not.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Phase;

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

/// Everything [`analyze`](crate::analysis::analyze) derives from a record.
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
    /// kvtier vs each competitor under the comparison rules ([`crate::analysis::fair`]).
    #[serde(default)]
    pub comparison: Vec<CompetitorComparison>,
}

/// One (step, kvtier op, competitor) comparison. Its fields keep the
/// record's names `peer`, `peer_op`, `peer_*`, which readers of
/// notes/*.json use (docs/architecture.md, Glossary).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CompetitorComparison {
    /// Step label (`c=8`).
    pub step: String,
    /// Total concurrency (closed loop) or rate.
    pub load: f64,
    /// kvtier op (`read`).
    pub op: String,
    /// Competitor name (`redis 7.0.15`).
    #[serde(rename = "peer")]
    pub competitor: String,
    /// Competitor op (`get`).
    #[serde(rename = "peer_op")]
    pub competitor_op: String,
    /// kvtier ops/s, median over repeats.
    pub kvtier_ops_s: f64,
    /// kvtier ops/s of each repeat.
    pub kvtier_repeats_ops_s: Vec<f64>,
    /// kvtier e2e p99 (µs), median over repeats.
    pub kvtier_p99_us: f64,
    /// The bench's client of the competitor: ops/s, median over repeats.
    #[serde(rename = "peer_client_ops_s")]
    pub competitor_client_ops_s: Option<f64>,
    /// The bench's client of the competitor: ops/s of each repeat.
    #[serde(rename = "peer_client_repeats_ops_s")]
    pub competitor_client_repeats_ops_s: Vec<f64>,
    /// The bench's client of the competitor: e2e p99 (µs), median over repeats.
    #[serde(rename = "peer_client_p99_us")]
    pub competitor_client_p99_us: Option<f64>,
    /// The competitor's own tool: ops/s.
    #[serde(rename = "peer_tool_ops_s")]
    pub competitor_tool_ops_s: Option<f64>,
    /// The competitor's own tool: p99 (µs).
    #[serde(rename = "peer_tool_p99_us")]
    pub competitor_tool_p99_us: Option<f64>,
    /// The competitor's best ops/s (rule 2), the ratio's denominator.
    #[serde(rename = "peer_best_ops_s")]
    pub competitor_best_ops_s: f64,
    /// p99 (µs) of the source that gave the best ops/s.
    #[serde(rename = "peer_best_p99_us")]
    pub competitor_best_p99_us: f64,
    /// `client` or `tool`.
    #[serde(rename = "peer_best_source")]
    pub competitor_best_source: String,
    /// kvtier / competitor best ops/s; `None` when excluded.
    pub throughput_ratio: Option<f64>,
    /// kvtier p99 / competitor best source's p99; `None` when excluded.
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
