//! What else a run measured besides kvtier: the competitor systems driven at the
//! same steps ([`CompetitorRun`]) with their own tools' results ([`CompetitorReference`]),
//! the network settings every system ran under ([`Network`], comparison
//! rule 1) and the raw link throughput ([`LinkProbe`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::Step;

/// A competitor system measured with the same steps in the same run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct CompetitorRun {
    /// e.g. `redis 7.0.15`, `mooncake-store 0.3.13.post1`.
    pub name: String,
    /// How the steps were driven, e.g. `kvtier bench RESP2 client`.
    #[serde(default)]
    pub client: String,
    /// kvtier op → competitor op used for ratio tables, e.g. `read → get`.
    #[serde(default)]
    pub op_map: BTreeMap<String, String>,
    /// Steps, same structure as [`Record::steps`](super::Record::steps).
    pub steps: Vec<Step>,
    /// The competitor's own benchmark tool, run against it in the same run (e.g.
    /// `redis-benchmark`): comparisons use the better of it and `steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<CompetitorReference>,
}

/// Congestion control of the sockets each system used, sampled with `ss`
/// while it was under load (both ends of each connection seen on this host).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Network {
    /// `net.ipv4.tcp_congestion_control` when the run started.
    pub system_default_cc: String,
    /// What kvtier's bench client asked for on data-plane sockets ("": system default).
    pub kvtier_client_cc: String,
    /// System (`kvtier`, or a competitor's name) → congestion control names seen on its sockets.
    pub observed_cc: BTreeMap<String, BTreeSet<String>>,
}

impl Network {
    /// Why the run's network settings were not equal between kvtier and `competitor`, if they were not.
    pub fn unequal(&self, competitor: &str) -> Option<String> {
        let k = self.observed_cc.get("kvtier")?;
        let p = self.observed_cc.get(competitor)?;
        (k != p).then(|| {
            let j = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join("+");
            format!(
                "unequal congestion control: kvtier {}, {competitor} {}",
                j(k),
                j(p)
            )
        })
    }
}

/// The competitor's own benchmark tool, run in the same run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct CompetitorReference {
    /// The command, with `{c}` for the concurrency.
    pub tool: String,
    /// One row per (concurrency, op).
    pub rows: Vec<ReferenceRow>,
}

/// One result line of the competitor's benchmark tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ReferenceRow {
    /// Connections (closed loop).
    pub concurrency: u32,
    /// Competitor op (`get`, `set`).
    pub op: String,
    /// Requests per second.
    pub throughput_ops_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// The tool's CPU time / (wall time × its threads), when measured: near 1
    /// the tool itself, not the competitor, may be the limit.
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
