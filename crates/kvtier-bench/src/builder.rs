//! Turns the load generator's raw histograms into a [`Step`].
//!
//! The generator fills one [`RepeatInput`] per repeat (merging its processes
//! with [`OpInput::merge`] / [`RepeatInput::merge_process`]), hands them to a
//! [`StepBuilder`], and calls [`StepBuilder::build`]. The builder merges the
//! histograms of all repeats and reads percentiles from the merged histogram;
//! per-repeat percentiles are kept only for the spread and for significance tests.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;

use crate::record::{AcrossRepeats, Mode, OpStats, Percentiles, Phase, RepeatOp, Spread, Step};

/// A fresh histogram for microsecond latencies: 3 significant digits, sized
/// for one hour and auto-resizing beyond that.
pub fn new_histogram() -> Histogram<u64> {
    let mut h = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
    h.auto(true);
    h
}

/// Records one value, clamping only if even auto-resizing cannot hold it.
pub fn record_us(h: &mut Histogram<u64>, micros: u64) {
    if h.record(micros).is_err() {
        h.saturating_record(micros);
    }
}

fn merge_hist(dst: &mut Histogram<u64>, src: &Histogram<u64>) -> anyhow::Result<()> {
    dst.add(src).context("merging histograms")
}

/// Raw results of one op in one repeat (one process, or several already merged).
#[derive(Debug, Clone, Default)]
pub struct OpInput {
    /// Completed operations, errors included.
    pub ops: u64,
    /// Failed operations.
    pub errors: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Tokens covered.
    pub tokens: u64,
    /// One histogram of microseconds per measured phase. In open loop
    /// `Phase::E2e` must be measured from the intended start.
    pub phases: BTreeMap<Phase, Histogram<u64>>,
    /// Open loop only: end to end from the actual send.
    pub e2e_uncorrected: Option<Histogram<u64>>,
}

impl OpInput {
    /// Records one sample of one phase, µs.
    pub fn record(&mut self, phase: Phase, micros: u64) {
        record_us(
            self.phases.entry(phase).or_insert_with(new_histogram),
            micros,
        );
    }

    /// Adds another process's (or window's) results into this one.
    pub fn merge(&mut self, other: &OpInput) -> anyhow::Result<()> {
        self.ops += other.ops;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.tokens += other.tokens;
        for (phase, h) in &other.phases {
            merge_hist(self.phases.entry(*phase).or_insert_with(new_histogram), h)?;
        }
        if let Some(h) = &other.e2e_uncorrected {
            merge_hist(self.e2e_uncorrected.get_or_insert_with(new_histogram), h)?;
        }
        Ok(())
    }
}

/// Raw results of one repeat of one step (all processes merged).
#[derive(Debug, Clone, Default)]
pub struct RepeatInput {
    /// Measured wall time (warm-up excluded).
    pub duration: Duration,
    /// Generator CPU time (user + system), all processes together.
    pub generator_cpu: Duration,
    /// Cores available to the generator processes together.
    pub generator_cores: u32,
    /// Open loop: intended start → send, all ops; `None` uses the `client_queue` phase.
    pub schedule_lag: Option<Histogram<u64>>,
    /// Open loop: sampled mean in-flight requests, if the generator measures it.
    pub mean_in_flight: Option<f64>,
    /// Per op.
    pub ops: BTreeMap<String, OpInput>,
}

impl RepeatInput {
    /// Merges another process's results of the same repeat: counts, CPU and
    /// histograms add up; the wall duration is the longer of the two.
    pub fn merge_process(&mut self, other: &RepeatInput) -> anyhow::Result<()> {
        self.duration = self.duration.max(other.duration);
        self.generator_cpu += other.generator_cpu;
        self.generator_cores = self.generator_cores.max(other.generator_cores);
        if let Some(h) = &other.schedule_lag {
            merge_hist(self.schedule_lag.get_or_insert_with(new_histogram), h)?;
        }
        self.mean_in_flight = match (self.mean_in_flight, other.mean_in_flight) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        for (name, op) in &other.ops {
            self.ops.entry(name.clone()).or_default().merge(op)?;
        }
        Ok(())
    }
}

/// Builds one [`Step`] from its repeats.
#[derive(Debug, Clone)]
pub struct StepBuilder {
    mode: Mode,
    processes: u32,
    repeats: Vec<RepeatInput>,
}

impl StepBuilder {
    /// A step at `mode` with `processes` generator processes.
    pub fn new(mode: Mode, processes: u32) -> Self {
        StepBuilder {
            mode,
            processes: processes.max(1),
            repeats: Vec::new(),
        }
    }

    /// Adds one repeat (index = number of repeats added before).
    pub fn add_repeat(&mut self, repeat: RepeatInput) -> &mut Self {
        self.repeats.push(repeat);
        self
    }

    /// Merges all repeats into a step. Flags are left empty: [`crate::analysis::analyze`] sets them.
    pub fn build(&self) -> anyhow::Result<Step> {
        anyhow::ensure!(!self.repeats.is_empty(), "step has no repeats");
        let total = self
            .repeats
            .iter()
            .map(|r| r.duration.as_secs_f64())
            .sum::<f64>();
        let cpu = self
            .repeats
            .iter()
            .map(|r| r.generator_cpu.as_secs_f64())
            .sum::<f64>();
        let cores = self
            .repeats
            .iter()
            .map(|r| r.generator_cores)
            .max()
            .unwrap_or(1)
            .max(1);
        let mut lag: Option<Histogram<u64>> = None;
        let mut names: Vec<&String> = self.repeats.iter().flat_map(|r| r.ops.keys()).collect();
        names.sort();
        names.dedup();
        let mut ops = BTreeMap::new();
        for name in names {
            let mut merged = OpInput::default();
            let mut per_repeat = Vec::new();
            for (i, r) in self.repeats.iter().enumerate() {
                let Some(op) = r.ops.get(name) else { continue };
                merged.merge(op)?;
                let secs = r.duration.as_secs_f64();
                per_repeat.push(RepeatOp {
                    repeat: i as u32,
                    throughput_ops_s: if secs > 0.0 {
                        op.ops as f64 / secs
                    } else {
                        0.0
                    },
                    e2e_us: op
                        .phases
                        .get(&Phase::E2e)
                        .map(Percentiles::from_histogram)
                        .unwrap_or_default(),
                });
            }
            ops.insert(name.clone(), op_stats(&merged, total, per_repeat));
        }
        for r in &self.repeats {
            let own = r.schedule_lag.clone().or_else(|| {
                let mut h: Option<Histogram<u64>> = None;
                for op in r.ops.values() {
                    if let Some(q) = op.phases.get(&Phase::ClientQueue) {
                        h.get_or_insert_with(new_histogram).add(q).ok()?;
                    }
                }
                h
            });
            if let (Mode::Open { .. }, Some(h)) = (self.mode, own) {
                merge_hist(lag.get_or_insert_with(new_histogram), &h)?;
            }
        }
        let in_flight: Vec<f64> = self
            .repeats
            .iter()
            .filter_map(|r| r.mean_in_flight)
            .collect();
        Ok(Step {
            mode: self.mode,
            processes: self.processes,
            repeats: self.repeats.len() as u32,
            duration_s: total,
            generator_cpu_utilisation: if total > 0.0 {
                cpu / (total * f64::from(cores))
            } else {
                0.0
            },
            generator_cores: cores,
            schedule_lag: lag.as_ref().map(Percentiles::from_histogram),
            mean_in_flight: (!in_flight.is_empty())
                .then(|| in_flight.iter().sum::<f64>() / in_flight.len() as f64),
            ops,
            flags: Vec::new(),
        })
    }
}

fn op_stats(m: &OpInput, secs: f64, per_repeat: Vec<RepeatOp>) -> OpStats {
    let rate = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
    let across_repeats = (per_repeat.len() >= 2).then(|| {
        let col = |f: &dyn Fn(&RepeatOp) -> f64| {
            Spread::of(&per_repeat.iter().map(f).collect::<Vec<_>>())
        };
        AcrossRepeats {
            throughput_ops_s: col(&|r| r.throughput_ops_s),
            p50_us: col(&|r| r.e2e_us.p50),
            p99_us: col(&|r| r.e2e_us.p99),
            p999_us: col(&|r| r.e2e_us.p999),
        }
    });
    OpStats {
        ops: m.ops,
        errors: m.errors,
        bytes: m.bytes,
        tokens: m.tokens,
        throughput_ops_s: rate(m.ops),
        tokens_per_s: rate(m.tokens),
        bytes_per_s: rate(m.bytes),
        latency_us: m
            .phases
            .iter()
            .map(|(p, h)| (*p, Percentiles::from_histogram(h)))
            .collect(),
        e2e_uncorrected_us: m.e2e_uncorrected.as_ref().map(Percentiles::from_histogram),
        per_repeat,
        across_repeats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repeat(values: std::ops::RangeInclusive<u64>, secs: u64) -> RepeatInput {
        let mut op = OpInput::default();
        for v in values {
            op.record(Phase::E2e, v);
            op.ops += 1;
            op.bytes += 1000;
        }
        let mut r = RepeatInput {
            duration: Duration::from_secs(secs),
            generator_cores: 2,
            ..Default::default()
        };
        r.generator_cpu = Duration::from_secs(secs);
        r.ops.insert("read".into(), op);
        r
    }

    #[test]
    fn repeats_are_merged_not_averaged() {
        // Repeat 0: 1..=100 µs; repeat 1: 901..=1000 µs. Averaging the p99s would give ~545;
        // the merged histogram's p99 is in the upper block.
        let mut b = StepBuilder::new(Mode::Closed { concurrency: 4 }, 1);
        b.add_repeat(repeat(1..=100, 1))
            .add_repeat(repeat(901..=1000, 1));
        let s = b.build().unwrap();
        let op = &s.ops["read"];
        let e2e = op.phase(Phase::E2e).unwrap();
        assert_eq!(e2e.count, 200);
        assert!(e2e.p99 >= 990.0, "{e2e:?}");
        assert!((op.throughput_ops_s - 100.0).abs() < 1e-9);
        assert!((op.bytes_per_s - 100_000.0).abs() < 1e-6);
        let spread = op.across_repeats.as_ref().unwrap();
        assert!(spread.p50_us.min <= 51.0 && spread.p50_us.max >= 950.0);
        assert!((s.generator_cpu_utilisation - 0.5).abs() < 1e-9);
        assert_eq!(s.repeats, 2);
    }

    #[test]
    fn processes_merge_counts_and_take_longest_duration() {
        let mut a = repeat(1..=10, 2);
        a.merge_process(&repeat(11..=20, 3)).unwrap();
        assert_eq!(a.duration, Duration::from_secs(3));
        assert_eq!(a.ops["read"].ops, 20);
        assert_eq!(a.generator_cpu, Duration::from_secs(5));
    }
}
