//! The child protocol: how a `--worker` child process reports its repeat to
//! the parent. A [`ChildReport`] is a `RepeatInput` as JSON-friendly data
//! (histograms as `(value, count)` pairs), lossless so the parent merges the
//! children's histograms as if they had been recorded in one process. (Not
//! to be confused with the data plane, which docs/wire.md calls the wire.)

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::us;
use crate::builder::{OpInput, RepeatInput, new_histogram};
use crate::record::Phase;

/// A histogram as `(value, count)` pairs.
type ReportHist = Vec<(u64, u64)>;

fn hist_to_report(h: &Histogram<u64>) -> ReportHist {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

fn hist_from_report(w: &ReportHist) -> Histogram<u64> {
    let mut h = new_histogram();
    for (v, c) in w {
        let _ = h.record_n(*v, *c);
    }
    h
}

#[derive(Serialize, Deserialize)]
struct ReportOp {
    ops: u64,
    errors: u64,
    bytes: u64,
    tokens: u64,
    phases: BTreeMap<String, ReportHist>,
    uncorrected: Option<ReportHist>,
}

/// [`RepeatInput`] as JSON-friendly data (what a child process reports).
#[derive(Serialize, Deserialize)]
pub struct ChildReport {
    duration_us: u64,
    cpu_us: u64,
    cores: u32,
    schedule_lag: Option<ReportHist>,
    mean_in_flight: Option<f64>,
    ops: BTreeMap<String, ReportOp>,
}

impl ChildReport {
    /// Encodes.
    pub fn from_input(r: &RepeatInput) -> Self {
        ChildReport {
            duration_us: us(r.duration),
            cpu_us: us(r.generator_cpu),
            cores: r.generator_cores,
            schedule_lag: r.schedule_lag.as_ref().map(hist_to_report),
            mean_in_flight: r.mean_in_flight,
            ops: r
                .ops
                .iter()
                .map(|(k, o)| {
                    (
                        k.clone(),
                        ReportOp {
                            ops: o.ops,
                            errors: o.errors,
                            bytes: o.bytes,
                            tokens: o.tokens,
                            phases: o
                                .phases
                                .iter()
                                .map(|(p, h)| (p.name().to_string(), hist_to_report(h)))
                                .collect(),
                            uncorrected: o.e2e_uncorrected.as_ref().map(hist_to_report),
                        },
                    )
                })
                .collect(),
        }
    }

    /// Decodes.
    pub fn into_input(self) -> anyhow::Result<RepeatInput> {
        let mut ops = BTreeMap::new();
        for (k, o) in self.ops {
            let mut phases = BTreeMap::new();
            for (p, h) in &o.phases {
                let phase = Phase::from_name(p).ok_or_else(|| anyhow::anyhow!("phase {p:?}"))?;
                phases.insert(phase, hist_from_report(h));
            }
            ops.insert(
                k,
                OpInput {
                    ops: o.ops,
                    errors: o.errors,
                    bytes: o.bytes,
                    tokens: o.tokens,
                    phases,
                    e2e_uncorrected: o.uncorrected.as_ref().map(hist_from_report),
                },
            );
        }
        Ok(RepeatInput {
            duration: Duration::from_micros(self.duration_us),
            generator_cpu: Duration::from_micros(self.cpu_us),
            generator_cores: self.cores,
            schedule_lag: self.schedule_lag.as_ref().map(hist_from_report),
            mean_in_flight: self.mean_in_flight,
            ops,
        })
    }
}
