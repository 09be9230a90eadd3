//! Comparisons with competitors, under the rules every published ratio follows
//! (docs/bench.md, "Comparisons"):
//!
//! 1. **Equal network settings.** The congestion control seen on each
//!    system's sockets during the run ([`Network`]) must be the same for
//!    kvtier and the competitor; otherwise the row is excluded.
//! 2. **The competitor's best number.** The denominator is the higher of the
//!    bench's own client of the competitor and the competitor's reference tool
//!    (`redis-benchmark`, …) at the same concurrency in the same run.
//! 3. **Saturated generators are excluded; medians are compared; outliers are
//!    shown.** A step whose generator (kvtier's, or the chosen competitor source's)
//!    used more than `client_cpu_max` of its cores, or that had errors, gets
//!    no ratio. Throughput and p99 are medians over repeats; a repeat outside
//!    [`OUTLIER_LOW`, `OUTLIER_HIGH`] × the median is listed, not dropped.
//!
//! Ratios are kvtier / competitor: throughput > 1 and p99 < 1 favour kvtier.

pub use crate::record::CompetitorComparison;
use crate::record::{CompetitorRun, Network, OpStats, Phase, Record, ReferenceRow, Spread, Step};

/// A repeat below this fraction of the median is reported as an outlier.
pub const OUTLIER_LOW: f64 = 0.75;
/// A repeat above this multiple of the median is reported as an outlier.
pub const OUTLIER_HIGH: f64 = 1.0 / OUTLIER_LOW;

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    Spread::of(v).median
}

fn repeats(op: &OpStats) -> Vec<f64> {
    if op.per_repeat.is_empty() {
        vec![op.throughput_ops_s]
    } else {
        op.per_repeat.iter().map(|r| r.throughput_ops_s).collect()
    }
}

fn median_p99(op: &OpStats) -> f64 {
    if op.per_repeat.is_empty() {
        op.phase(Phase::E2e).map_or(0.0, |p| p.p99)
    } else {
        median(
            &op.per_repeat
                .iter()
                .map(|r| r.e2e_us.p99)
                .collect::<Vec<_>>(),
        )
    }
}

/// Repeats outside [`OUTLIER_LOW`, `OUTLIER_HIGH`] × the median, as text.
pub fn outliers(who: &str, values: &[f64]) -> Vec<String> {
    let m = median(values);
    if m <= 0.0 || values.len() < 2 {
        return Vec::new();
    }
    values
        .iter()
        .enumerate()
        .filter(|(_, v)| **v < m * OUTLIER_LOW || **v > m * OUTLIER_HIGH)
        .map(|(i, v)| {
            format!(
                "{who} repeat {}: {v:.1} ops/s is {:.2}× the median {m:.1}",
                i + 1,
                v / m
            )
        })
        .collect()
}

fn saturated(step: &Step, who: &str) -> Option<String> {
    step.flags
        .iter()
        .find(|f| f.kind == "client_cpu")
        .map(|f| format!("{who}: {}", f.message))
}

fn errors(step: &Step, op: &str, who: &str) -> Option<String> {
    let o = step.ops.get(op)?;
    (o.errors > 0).then(|| format!("{who}: {} of {} {op} operations failed", o.errors, o.ops))
}

fn tool_row<'a>(competitor: &'a CompetitorRun, step: &Step, op: &str) -> Option<&'a ReferenceRow> {
    let c = step.total_concurrency()?;
    competitor
        .reference
        .as_ref()?
        .rows
        .iter()
        .find(|r| r.concurrency == c && r.op == op)
}

/// One row per (kvtier step, kvtier op, competitor) that the competitor measured too.
/// `client_cpu_max`: the saturation threshold the steps were flagged with.
pub fn compare(
    steps: &[Step],
    competitors: &[CompetitorRun],
    network: Option<&Network>,
    client_cpu_max: f64,
) -> Vec<CompetitorComparison> {
    let mut rows = Vec::new();
    for competitor in competitors {
        let net = network.and_then(|n| n.unequal(&competitor.name));
        for step in steps {
            let ps = competitor.steps.iter().find(|p| p.label() == step.label());
            for (kop, pop) in &competitor.op_map {
                let Some(k) = step.ops.get(kop) else { continue };
                let client = ps.and_then(|p| p.ops.get(pop).map(|o| (p, o)));
                let tool = tool_row(competitor, step, pop);
                if client.is_none() && tool.is_none() {
                    continue;
                }
                let mut row = CompetitorComparison {
                    step: step.label(),
                    load: step.load(),
                    op: kop.clone(),
                    competitor: competitor.name.clone(),
                    competitor_op: pop.clone(),
                    kvtier_repeats_ops_s: repeats(k),
                    kvtier_p99_us: median_p99(k),
                    ..Default::default()
                };
                row.kvtier_ops_s = median(&row.kvtier_repeats_ops_s);
                row.outliers = outliers("kvtier", &row.kvtier_repeats_ops_s);
                row.excluded.extend(saturated(step, "kvtier generator"));
                row.excluded.extend(errors(step, kop, "kvtier"));
                row.excluded.extend(net.clone());
                let mut client_sat = None;
                if let Some((ps, o)) = client {
                    row.competitor_client_repeats_ops_s = repeats(o);
                    row.competitor_client_ops_s =
                        Some(median(&row.competitor_client_repeats_ops_s));
                    row.competitor_client_p99_us = Some(median_p99(o));
                    row.outliers.extend(outliers(
                        &competitor.name,
                        &row.competitor_client_repeats_ops_s,
                    ));
                    row.excluded.extend(errors(ps, pop, &competitor.name));
                    client_sat = saturated(ps, &format!("{} client", competitor.name));
                }
                if let Some(t) = tool {
                    row.competitor_tool_ops_s = Some(t.throughput_ops_s);
                    row.competitor_tool_p99_us = Some(t.p99_us);
                }
                let use_tool = match (row.competitor_client_ops_s, row.competitor_tool_ops_s) {
                    (Some(c), Some(t)) => t > c,
                    (None, Some(_)) => true,
                    _ => false,
                };
                if use_tool {
                    let t = tool.expect("tool row");
                    row.competitor_best_ops_s = t.throughput_ops_s;
                    row.competitor_best_p99_us = t.p99_us;
                    row.competitor_best_source = "tool".into();
                    if let Some(u) = t.generator_cpu_utilisation.filter(|u| *u > client_cpu_max) {
                        row.excluded.push(format!(
                            "{} tool used {:.0}% of its CPU (limit {:.0}%)",
                            competitor.name,
                            u * 100.0,
                            client_cpu_max * 100.0
                        ));
                    }
                } else {
                    row.competitor_best_ops_s = row.competitor_client_ops_s.unwrap_or(0.0);
                    row.competitor_best_p99_us = row.competitor_client_p99_us.unwrap_or(0.0);
                    row.competitor_best_source = "client".into();
                    row.excluded.extend(client_sat);
                }
                if row.excluded.is_empty() && row.competitor_best_ops_s > 0.0 {
                    row.throughput_ratio = Some(row.kvtier_ops_s / row.competitor_best_ops_s);
                    row.p99_ratio = (row.competitor_best_p99_us > 0.0)
                        .then(|| row.kvtier_p99_us / row.competitor_best_p99_us);
                }
                rows.push(row);
            }
        }
    }
    rows
}

/// [`compare`] over a whole record with its thresholds.
pub fn compare_record(r: &Record) -> Vec<CompetitorComparison> {
    compare(
        &r.steps,
        &r.competitors,
        r.network.as_ref(),
        r.analysis_config_thresholds().client_cpu_max,
    )
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::record::{Flag, Mode, Percentiles, RepeatOp};

    fn step(c: u32, op: &str, reps: &[f64], p99: f64, errors: u64) -> Step {
        let per_repeat = reps
            .iter()
            .enumerate()
            .map(|(i, t)| RepeatOp {
                repeat: i as u32,
                throughput_ops_s: *t,
                e2e_us: Percentiles {
                    p99,
                    ..Default::default()
                },
            })
            .collect();
        let o = OpStats {
            ops: 1000,
            errors,
            throughput_ops_s: reps.iter().sum::<f64>() / reps.len() as f64,
            per_repeat,
            ..Default::default()
        };
        Step {
            mode: Mode::Closed { concurrency: c },
            processes: 1,
            repeats: reps.len() as u32,
            duration_s: 1.0,
            generator_cpu_utilisation: 0.3,
            generator_cores: 1,
            schedule_lag: None,
            mean_in_flight: None,
            ops: BTreeMap::from([(op.to_string(), o)]),
            flags: Vec::new(),
        }
    }

    fn competitor(steps: Vec<Step>, tool: Option<(f64, f64, f64)>) -> CompetitorRun {
        CompetitorRun {
            name: "redis".into(),
            op_map: BTreeMap::from([("read".into(), "get".into())]),
            steps,
            reference: tool.map(|(ops, p99, cpu)| crate::record::CompetitorReference {
                tool: "redis-benchmark".into(),
                rows: vec![ReferenceRow {
                    concurrency: 8,
                    op: "get".into(),
                    throughput_ops_s: ops,
                    p50_us: 0.0,
                    p99_us: p99,
                    generator_cpu_utilisation: Some(cpu),
                }],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_denominator_is_the_competitors_best_source_and_ratios_use_medians() {
        let k = vec![step(8, "read", &[100.0, 110.0, 90.0], 1000.0, 0)];
        // Client median 80, tool 95: the tool is the denominator.
        let p = competitor(
            vec![step(8, "get", &[80.0, 79.0, 85.0], 500.0, 0)],
            Some((95.0, 400.0, 0.5)),
        );
        let rows = compare(&k, &[p], None, 0.9);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.kvtier_ops_s, 100.0);
        assert_eq!(r.competitor_client_ops_s, Some(80.0));
        assert_eq!(r.competitor_best_source, "tool");
        assert!((r.throughput_ratio.unwrap() - 100.0 / 95.0).abs() < 1e-9);
        assert!((r.p99_ratio.unwrap() - 2.5).abs() < 1e-9);
        // Tool below the client: the client is the denominator.
        let p = competitor(
            vec![step(8, "get", &[80.0, 79.0, 85.0], 500.0, 0)],
            Some((60.0, 400.0, 0.5)),
        );
        let r = &compare(&k, &[p], None, 0.9)[0];
        assert_eq!(r.competitor_best_source, "client");
        assert!((r.throughput_ratio.unwrap() - 100.0 / 80.0).abs() < 1e-9);
    }

    #[test]
    fn an_outlier_repeat_is_reported_and_does_not_move_the_median() {
        let k = vec![step(8, "read", &[2387.0, 162.0, 2476.0], 1000.0, 0)];
        let p = competitor(vec![step(8, "get", &[1000.0; 3], 1000.0, 0)], None);
        let r = &compare(&k, &[p], None, 0.9)[0];
        assert_eq!(r.kvtier_ops_s, 2387.0);
        assert_eq!(r.outliers.len(), 1, "{:?}", r.outliers);
        assert!(r.outliers[0].contains("repeat 2"), "{:?}", r.outliers);
    }

    #[test]
    fn saturated_generators_errors_and_unequal_networks_get_no_ratio() {
        let p = || competitor(vec![step(8, "get", &[100.0; 2], 1000.0, 0)], None);
        let mut k = vec![step(8, "read", &[100.0; 2], 1000.0, 0)];
        k[0].flags.push(Flag {
            kind: "client_cpu".into(),
            message: "generator used 97% of 1 cores".into(),
        });
        let r = &compare(&k, &[p()], None, 0.9)[0];
        assert_eq!(r.throughput_ratio, None);
        assert!(r.excluded[0].contains("97%"), "{:?}", r.excluded);

        let k = vec![step(8, "read", &[100.0; 2], 1000.0, 3)];
        assert_eq!(compare(&k, &[p()], None, 0.9)[0].throughput_ratio, None);

        // The chosen tool source saturated.
        let k = vec![step(8, "read", &[100.0; 2], 1000.0, 0)];
        let sat = competitor(
            vec![step(8, "get", &[50.0; 2], 1000.0, 0)],
            Some((90.0, 1.0, 0.99)),
        );
        let r = &compare(&k, &[sat], None, 0.9)[0];
        assert_eq!(r.competitor_best_source, "tool");
        assert_eq!(r.throughput_ratio, None);

        let mut net = Network::default();
        net.observed_cc
            .insert("kvtier".into(), BTreeSet::from(["reno".to_string()]));
        net.observed_cc
            .insert("redis".into(), BTreeSet::from(["bbr".to_string()]));
        let r = &compare(&k, &[p()], Some(&net), 0.9)[0];
        assert_eq!(r.throughput_ratio, None);
        assert!(r.excluded[0].contains("unequal congestion control"));
        net.observed_cc
            .insert("redis".into(), BTreeSet::from(["reno".to_string()]));
        assert_eq!(
            compare(&k, &[p()], Some(&net), 0.9)[0].throughput_ratio,
            Some(1.0)
        );
    }
}
