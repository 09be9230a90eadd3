//! Self-checks and derived results of a run: pure functions over [`Step`]s.
//!
//! [`analyze`] runs everything on a [`Record`] and stores the result in
//! `record.analysis`, and the flags in each step: Little's law, client
//! saturation (generator CPU, open-loop schedule lag), latency falling as load
//! rises, errors. Flagged steps stay in every table, marked; recommendations
//! say when they rest on a flagged step. The heavier pieces live in their own
//! modules: [`knee`], [`usl`], [`sla`], [`co`], [`fair`] (comparisons with competitors) and
//! [`compare`] (two records).
pub mod co;
pub mod compare;
pub mod fair;
pub mod knee;
pub mod sla;
pub mod usl;

pub use crate::record::{
    Analysis, Degradation, DegradationRow, Knee, LittleCheck, Multipliers, OpUsl, Thresholds,
};

use std::collections::BTreeMap;

use crate::analysis::knee::{Shape, kneedle, prefers_log_x};
use crate::analysis::sla::{parse_slas, plan_capacity, recommend};
use crate::analysis::usl::fit_usl;
use crate::record::{Flag, Mode, Phase, Record, Step};

/// Flag kinds set by [`check_steps`]; others (set by the generator) are kept untouched.
pub const ANALYSIS_FLAG_KINDS: [&str; 5] = [
    "littles_law",
    "client_cpu",
    "schedule_lag",
    "latency_fell",
    "errors",
];

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            littles_law_tolerance: 0.10,
            client_cpu_max: 0.90,
            schedule_lag_p99_us: 1_000.0,
            latency_fall_tolerance: 0.10,
        }
    }
}

fn flag(kind: &str, message: String) -> Flag {
    Flag {
        kind: kind.to_string(),
        message,
    }
}

/// Little's law for one step (see [`LittleCheck`]).
pub fn littles_law(step: &Step, tolerance: f64) -> LittleCheck {
    let predicted: f64 = step
        .ops
        .values()
        .map(|o| o.throughput_ops_s * o.phase(Phase::E2e).map_or(0.0, |p| p.mean) / 1e6)
        .sum();
    let expected = match step.mode {
        Mode::Closed { .. } => step.total_concurrency().map(f64::from),
        Mode::Open { .. } => step.mean_in_flight,
    };
    let ratio = expected.filter(|e| *e > 0.0).map(|e| predicted / e);
    LittleCheck {
        step: step.label(),
        expected_in_flight: expected,
        predicted_in_flight: predicted,
        ratio,
        ok: ratio.is_none_or(|r| (r - 1.0).abs() <= tolerance),
    }
}

/// Flags for one step alone: Little's law, client CPU, schedule lag, open-loop rate shortfall, errors.
pub fn step_flags(step: &Step, t: &Thresholds) -> Vec<Flag> {
    let mut flags = Vec::new();
    let l = littles_law(step, t.littles_law_tolerance);
    if let (false, Some(r), Some(e)) = (l.ok, l.ratio, l.expected_in_flight) {
        flags.push(flag(
            "littles_law",
            format!(
                "throughput × mean latency = {:.2} in flight, expected {e:.2} ({:+.0}%, tolerance {:.0}%)",
                l.predicted_in_flight,
                (r - 1.0) * 100.0,
                t.littles_law_tolerance * 100.0
            ),
        ));
    }
    if step.generator_cpu_utilisation > t.client_cpu_max {
        flags.push(flag(
            "client_cpu",
            format!(
                "generator used {:.0}% of {} cores (limit {:.0}%): the client may be the bottleneck",
                step.generator_cpu_utilisation * 100.0,
                step.generator_cores,
                t.client_cpu_max * 100.0
            ),
        ));
    }
    if let Mode::Open { rate_per_s } = step.mode {
        if let Some(lag) = step.schedule_lag.filter(|l| l.p99 > t.schedule_lag_p99_us) {
            flags.push(flag(
                "schedule_lag",
                format!(
                    "generator fell behind its schedule: lag p99 {:.0} µs, max {:.0} µs",
                    lag.p99, lag.max
                ),
            ));
        }
        let achieved = step.total_throughput();
        if achieved < rate_per_s * (1.0 - t.littles_law_tolerance) {
            flags.push(flag(
                "schedule_lag",
                format!("achieved {achieved:.1} ops/s of the intended {rate_per_s} ops/s"),
            ));
        }
    }
    let (ops, errors) = step
        .ops
        .values()
        .fold((0, 0), |(a, b), o| (a + o.ops, b + o.errors));
    if errors > 0 {
        flags.push(flag(
            "errors",
            format!("{errors} of {ops} operations failed"),
        ));
    }
    flags
}

/// Closed-loop steps sorted by total concurrency (stable for equal totals).
pub fn closed_by_concurrency(steps: &[Step]) -> Vec<&Step> {
    let mut v: Vec<&Step> = steps
        .iter()
        .filter(|s| s.total_concurrency().is_some())
        .collect();
    v.sort_by(|a, b| a.load().total_cmp(&b.load()));
    v
}

/// For each closed-loop step (by index into `steps`), ops whose p50 fell by more than
/// `tolerance` vs the nearest lower concurrency: a sign of warm-up or measurement trouble.
pub fn latency_fell(steps: &[Step], tolerance: f64) -> Vec<(usize, Flag)> {
    let mut order: Vec<usize> = (0..steps.len())
        .filter(|&i| steps[i].total_concurrency().is_some())
        .collect();
    order.sort_by(|&a, &b| steps[a].load().total_cmp(&steps[b].load()));
    let mut out = Vec::new();
    let mut last: BTreeMap<&str, (f64, f64)> = BTreeMap::new(); // op → (load, p50)
    for &i in &order {
        let s = &steps[i];
        for (name, op) in &s.ops {
            let Some(p50) = op.phase(Phase::E2e).map(|p| p.p50) else {
                continue;
            };
            if let Some(&(load, prev)) = last.get(name.as_str())
                && load < s.load()
                && p50 < prev * (1.0 - tolerance)
            {
                out.push((
                    i,
                    flag(
                        "latency_fell",
                        format!(
                            "{name} p50 fell {:.0}% vs c={load}: {prev:.0} → {p50:.0} µs",
                            (1.0 - p50 / prev) * 100.0
                        ),
                    ),
                ));
            }
            last.insert(name, (s.load(), p50));
        }
    }
    out
}

/// Recomputes the analysis flags of every step (flags of other kinds are kept).
pub fn check_steps(steps: &mut [Step], t: &Thresholds) {
    for s in steps.iter_mut() {
        s.flags
            .retain(|f| !ANALYSIS_FLAG_KINDS.contains(&f.kind.as_str()));
        let new = step_flags(s, t);
        s.flags.extend(new);
    }
    for (i, f) in latency_fell(steps, t.latency_fall_tolerance) {
        steps[i].flags.push(f);
    }
}

/// Knees of p50, p99 (convex) and throughput (concave) vs total concurrency, per op and for all ops.
pub fn knees(steps: &[Step]) -> Vec<Knee> {
    let closed = closed_by_concurrency(steps);
    let mut names: Vec<String> = closed.iter().flat_map(|s| s.ops.keys().cloned()).collect();
    names.sort();
    names.dedup();
    let mut out = Vec::new();
    let mut push = |op: &str, curve: &str, pts: Vec<(f64, f64)>, shape| {
        if let Some(i) = kneedle(&pts, shape, prefers_log_x(&pts)) {
            out.push(Knee {
                op: op.to_string(),
                curve: curve.to_string(),
                concurrency: pts[i].0,
                value: pts[i].1,
            });
        }
    };
    for name in &names {
        let with: Vec<&&Step> = closed.iter().filter(|s| s.ops.contains_key(name)).collect();
        let stat = |f: &dyn Fn(&Step) -> Option<f64>| {
            with.iter()
                .filter_map(|s| Some((s.load(), f(s)?)))
                .collect::<Vec<_>>()
        };
        let e2e = |s: &Step| s.ops[name].phase(Phase::E2e).copied();
        push(name, "p50", stat(&|s| e2e(s).map(|p| p.p50)), Shape::Convex);
        push(name, "p99", stat(&|s| e2e(s).map(|p| p.p99)), Shape::Convex);
        push(
            name,
            "throughput",
            stat(&|s| Some(s.ops[name].throughput_ops_s)),
            Shape::Concave,
        );
    }
    if names.len() > 1 {
        push(
            "all",
            "throughput",
            closed
                .iter()
                .map(|s| (s.load(), s.total_throughput()))
                .collect(),
            Shape::Concave,
        );
    }
    out
}

/// USL fits per op and for all ops (needs ≥ 3 closed-loop steps).
pub fn usl_fits(steps: &[Step]) -> Vec<OpUsl> {
    let closed = closed_by_concurrency(steps);
    let mut names: Vec<String> = closed.iter().flat_map(|s| s.ops.keys().cloned()).collect();
    names.sort();
    names.dedup();
    let mut out: Vec<OpUsl> = names
        .iter()
        .filter_map(|n| {
            let pts: Vec<(f64, f64)> = closed
                .iter()
                .filter_map(|s| Some((s.load(), s.ops.get(n)?.throughput_ops_s)))
                .collect();
            Some(OpUsl {
                op: n.clone(),
                fit: fit_usl(&pts)?,
            })
        })
        .collect();
    if names.len() > 1 {
        let pts: Vec<(f64, f64)> = closed
            .iter()
            .map(|s| (s.load(), s.total_throughput()))
            .collect();
        if let Some(fit) = fit_usl(&pts) {
            out.push(OpUsl {
                op: "all".into(),
                fit,
            });
        }
    }
    out
}

/// p50/p99 multipliers per op and phase vs the lowest-concurrency closed-loop step.
pub fn degradation(steps: &[Step]) -> Vec<Degradation> {
    let closed = closed_by_concurrency(steps);
    let Some(base) = closed.first() else {
        return Vec::new();
    };
    base.ops
        .iter()
        .map(|(name, bop)| Degradation {
            op: name.clone(),
            baseline_concurrency: base.load(),
            rows: closed
                .iter()
                .filter_map(|s| {
                    let op = s.ops.get(name)?;
                    let phases = op
                        .latency_us
                        .iter()
                        .filter_map(|(ph, p)| {
                            let b = bop.phase(*ph)?;
                            (b.p50 > 0.0 && b.p99 > 0.0).then(|| {
                                (
                                    *ph,
                                    Multipliers {
                                        p50: p.p50 / b.p50,
                                        p99: p.p99 / b.p99,
                                    },
                                )
                            })
                        })
                        .collect();
                    Some(DegradationRow {
                        step: s.label(),
                        concurrency: s.load(),
                        phases,
                        flagged: !s.flags.is_empty(),
                    })
                })
                .collect(),
        })
        .collect()
}

/// kvtier op → competitor op: the same name when the competitor measured it, else
/// `read → get`, `write → set`, `lookup → exists` when the competitor has those.
pub fn default_op_map(ours: &[Step], competitor: &[Step]) -> BTreeMap<String, String> {
    let has = |steps: &[Step], op: &str| steps.iter().any(|s| s.ops.contains_key(op));
    let mut names: Vec<&String> = ours.iter().flat_map(|s| s.ops.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|op| {
            let alias = match op.as_str() {
                "read" => "get",
                "write" => "set",
                "lookup" => "exists",
                _ => "",
            };
            [op.as_str(), alias]
                .into_iter()
                .find(|p| !p.is_empty() && has(competitor, p))
                .map(|p| (op.clone(), p.to_string()))
        })
        .collect()
}

/// Runs every check and analysis on `record` (also on the competitor's steps) and stores the result.
pub fn analyze(record: &mut Record) {
    let t = record.analysis_config_thresholds();
    check_steps(&mut record.steps, &t);
    for competitor in &mut record.competitors {
        check_steps(&mut competitor.steps, &t);
        if competitor.op_map.is_empty() {
            competitor.op_map = default_op_map(&record.steps, &competitor.steps);
        }
    }
    let mut a = Analysis {
        thresholds: t,
        littles_law: record
            .steps
            .iter()
            .map(|s| littles_law(s, t.littles_law_tolerance))
            .collect(),
        knees: knees(&record.steps),
        usl: usl_fits(&record.steps),
        degradation: degradation(&record.steps),
        ..Analysis::default()
    };
    if closed_by_concurrency(&record.steps).len() < 3 {
        a.warnings
            .push("fewer than 3 closed-loop steps: no knee or USL fit".into());
    }
    match parse_slas(&record.analysis_config.slas) {
        Ok(slas) => {
            let mut sets: Vec<Vec<_>> = slas.iter().map(|s| vec![s.clone()]).collect();
            if slas.len() > 1 {
                sets.push(slas.clone());
            }
            for set in sets {
                for rec in recommend(&record.steps, &set) {
                    if let Some(target) = record.analysis_config.target_tokens_per_s {
                        a.capacity.extend(plan_capacity(&rec, target));
                    }
                    a.recommendations.push(rec);
                }
            }
        }
        Err(e) => a.warnings.push(format!("SLA not applied: {e:#}")),
    }
    a.comparison = crate::analysis::fair::compare_record(record);
    record.analysis = Some(a);
}

impl Record {
    /// Thresholds for the analysis (defaults unless configured).
    pub fn analysis_config_thresholds(&self) -> Thresholds {
        self.analysis_config.thresholds.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{littles_step, synthetic_record, synthetic_step};

    #[test]
    fn littles_law_flags_only_when_off_by_more_than_tolerance() {
        let t = Thresholds::default();
        let ok = littles_step(8, 10_000.0); // 800 ops/s × 10 ms = 8
        assert!(littles_law(&ok, 0.1).ok);
        assert!(step_flags(&ok, &t).is_empty());
        // Throughput 15 % low for the latency: generator overhead between requests.
        let mut off = ok.clone();
        off.ops.get_mut("read").unwrap().throughput_ops_s *= 0.85;
        let l = littles_law(&off, 0.1);
        assert!(!l.ok && (l.ratio.unwrap() - 0.85).abs() < 1e-9);
        assert!(step_flags(&off, &t).iter().any(|f| f.kind == "littles_law"));
        // 5 % off is within tolerance.
        let mut near = ok.clone();
        near.ops.get_mut("read").unwrap().throughput_ops_s *= 0.95;
        assert!(littles_law(&near, 0.1).ok);
    }

    #[test]
    fn client_saturation_and_schedule_lag_flagged() {
        let t = Thresholds::default();
        let mut s = littles_step(4, 1_000.0);
        s.generator_cpu_utilisation = 0.95;
        assert!(step_flags(&s, &t).iter().any(|f| f.kind == "client_cpu"));
        let mut open = littles_step(1, 1_000.0); // 1000 ops/s
        open.mode = Mode::Open { rate_per_s: 1000.0 };
        assert!(step_flags(&open, &t).is_empty());
        open.schedule_lag = Some(crate::testutil::pct(10.0, 5_000.0));
        assert!(
            step_flags(&open, &t)
                .iter()
                .any(|f| f.kind == "schedule_lag")
        );
        open.schedule_lag = None;
        open.mode = Mode::Open { rate_per_s: 2000.0 }; // achieved only half
        assert!(
            step_flags(&open, &t)
                .iter()
                .any(|f| f.kind == "schedule_lag")
        );
    }

    #[test]
    fn latency_falling_with_load_is_flagged() {
        let steps = vec![
            synthetic_step(1, &[("read", 10_000.0, 20_000.0, 100.0)]),
            synthetic_step(4, &[("read", 9_500.0, 20_000.0, 400.0)]), // −5 %: fine
            synthetic_step(2, &[("read", 10_000.0, 20_000.0, 200.0)]),
            synthetic_step(8, &[("read", 7_000.0, 20_000.0, 800.0)]), // −26 % vs c=4: flagged
        ];
        let fell = latency_fell(&steps, 0.1);
        assert_eq!(fell.len(), 1);
        assert_eq!(fell[0].0, 3);
        assert!(fell[0].1.message.contains("c=4"), "{}", fell[0].1.message);
    }

    #[test]
    fn degradation_multipliers_vs_concurrency_one() {
        let steps = vec![
            synthetic_step(2, &[("read", 20.0, 60.0, 1.0)]),
            synthetic_step(1, &[("read", 10.0, 40.0, 1.0)]),
        ];
        let d = degradation(&steps);
        assert_eq!(d[0].baseline_concurrency, 1.0);
        let row = &d[0].rows[1];
        assert_eq!(row.concurrency, 2.0);
        assert_eq!(row.phases[&Phase::E2e], Multipliers { p50: 2.0, p99: 1.5 });
        assert_eq!(
            row.phases[&Phase::Network],
            Multipliers { p50: 2.0, p99: 1.5 }
        );
        assert_eq!(
            d[0].rows[0].phases[&Phase::E2e],
            Multipliers { p50: 1.0, p99: 1.0 }
        );
    }

    #[test]
    fn analyze_synthetic_record() {
        let mut r = synthetic_record();
        r.steps[2].flags.push(Flag {
            kind: "generator".into(),
            message: "kept".into(),
        });
        analyze(&mut r);
        analyze(&mut r); // idempotent
        assert_eq!(r.steps[2].flags.len(), 1);
        assert!(
            r.steps
                .iter()
                .all(|s| s.flags.iter().all(|f| f.kind != "littles_law"))
        );
        let a = r.analysis.as_ref().unwrap();
        // Latency flat to c = 8 then ∝ c; throughput linear to 8 then flat.
        let knee = |curve: &str| {
            a.knees
                .iter()
                .find(|k| k.curve == curve)
                .unwrap()
                .concurrency
        };
        assert_eq!(knee("p50"), 8.0);
        assert_eq!(knee("throughput"), 8.0);
        let fit = &a.usl[0].fit;
        assert!(fit.r_squared > 0.9, "{fit:?}");
        // read.p99 = 3 × p50 = 30 ms up to c = 8, 60 ms at 16: recommend 8.
        let rec = &a.recommendations[0];
        assert_eq!(rec.load, Some(8.0));
        // 800 ops/s × 128 tokens = 102,400 tok/s → 10 servers for 1M tok/s.
        assert_eq!(a.capacity[0].servers_needed, 10);
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    }
}
