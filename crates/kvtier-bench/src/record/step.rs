//! The measured half of the record: how a step applied load ([`Mode`]), the
//! latency [`Phase`]s, and a [`Step`]'s per-op results ([`OpStats`]) with
//! their percentiles, per-repeat figures and spread across repeats.
//!
//! These are the types the generator fills (through
//! `crate::builder::StepBuilder`) and every analysis reads; competitors' runs reuse
//! them unchanged, so kvtier and a competitor are measured in the same shape.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
