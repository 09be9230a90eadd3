//! Renders `summary.md`: the seeds' tables (000, 001), generated from a [`Record`].
//!
//! Latencies are milliseconds with two decimals, as in the seeds. Rows of
//! flagged steps carry ⚠ and the flags are listed at the end: flagged data is
//! shown, never silently used. Call [`crate::analysis::analyze`] first; the
//! analysis sections are skipped when `record.analysis` is empty.

use std::fmt::Write;

use crate::analysis::Analysis;
use crate::record::{CompetitorRun, Phase, Record, Step};

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

fn label(s: &Step) -> String {
    if s.flags.is_empty() {
        s.label()
    } else {
        format!("{} ⚠", s.label())
    }
}

fn gbit(bytes_per_s: f64) -> f64 {
    bytes_per_s * 8.0 / 1e9
}

/// Ops measured in any step, sorted.
pub fn op_names(steps: &[Step]) -> Vec<String> {
    let mut v: Vec<String> = steps.iter().flat_map(|s| s.ops.keys().cloned()).collect();
    v.sort();
    v.dedup();
    v
}

/// Phases other than e2e measured for `op` in any step.
fn extra_phases(steps: &[Step], op: &str) -> Vec<Phase> {
    Phase::ALL[1..]
        .iter()
        .copied()
        .filter(|p| {
            steps.iter().any(|s| {
                s.ops
                    .get(op)
                    .is_some_and(|o| o.phase(*p).is_some_and(|x| x.count > 0))
            })
        })
        .collect()
}

fn header(out: &mut String, cols: &[String]) {
    let _ = writeln!(out, "| {} |", cols.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(cols.len()));
}

fn latency_tables(out: &mut String, steps: &[Step]) {
    for op in op_names(steps) {
        let phases = extra_phases(steps, &op);
        let open = steps.iter().any(|s| {
            s.ops
                .get(&op)
                .is_some_and(|o| o.e2e_uncorrected_us.is_some())
        });
        let spread = steps
            .iter()
            .any(|s| s.ops.get(&op).is_some_and(|o| o.across_repeats.is_some()));
        let _ = writeln!(out, "### {op}\n");
        let mut cols: Vec<String> = ["Step", "ops/s", "p50 E2E", "p90 E2E", "p99 E2E", "p999 E2E"]
            .map(String::from)
            .to_vec();
        for p in &phases {
            cols.push(format!("p50 {}", p.name()));
            cols.push(format!("p99 {}", p.name()));
        }
        if open {
            cols.push("p99 uncorrected".into());
        }
        if spread {
            cols.push("p99 repeats min–max".into());
        }
        header(out, &cols);
        for s in steps {
            let Some(o) = s.ops.get(&op) else { continue };
            let e = o.phase(Phase::E2e).copied().unwrap_or_default();
            let mut row = vec![
                label(s),
                format!("{:.1}", o.throughput_ops_s),
                ms(e.p50),
                ms(e.p90),
                ms(e.p99),
                ms(e.p999),
            ];
            for p in &phases {
                let x = o.phase(*p).copied().unwrap_or_default();
                row.push(ms(x.p50));
                row.push(ms(x.p99));
            }
            if open {
                row.push(o.e2e_uncorrected_us.map_or("–".into(), |u| ms(u.p99)));
            }
            if spread {
                row.push(o.across_repeats.as_ref().map_or("–".into(), |a| {
                    format!("{}–{}", ms(a.p99_us.min), ms(a.p99_us.max))
                }));
            }
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out.push('\n');
    }
}

fn throughput_table(out: &mut String, r: &Record) {
    let ops = op_names(&r.steps);
    let _ = writeln!(out, "## Throughput and bandwidth\n");
    let mut cols = vec!["Step".to_string(), "ops/s".into(), "tokens/s".into()];
    cols.extend(ops.iter().map(|o| format!("{o} Gbit/s")));
    cols.push("Total Gbit/s".into());
    if r.link_probe.is_some() {
        cols.push("Link utilisation".into());
    }
    header(out, &cols);
    for s in &r.steps {
        let mut row = vec![
            label(s),
            format!("{:.1}", s.total_throughput()),
            format!("{:.0}", s.total_tokens_per_s()),
        ];
        row.extend(ops.iter().map(|o| {
            s.ops
                .get(o)
                .map_or("–".into(), |x| format!("{:.2}", gbit(x.bytes_per_s)))
        }));
        let total = gbit(s.total_bytes_per_s());
        row.push(format!("**{total:.2}**"));
        if let Some(l) = &r.link_probe {
            row.push(if l.gbit_per_s > 0.0 {
                format!("{:.1}%", total / l.gbit_per_s * 100.0)
            } else {
                "–".into()
            });
        }
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    if let Some(l) = &r.link_probe {
        let _ = writeln!(
            out,
            "\nLink probe: {:.2} Gbit/s ({} streams, {:.0} s, {}).",
            l.gbit_per_s, l.streams, l.duration_s, l.method
        );
    }
    out.push('\n');
}

fn degradation_tables(out: &mut String, a: &Analysis) {
    let _ = writeln!(out, "## Latency degradation\n");
    for d in &a.degradation {
        let knee = a
            .knees
            .iter()
            .find(|k| k.op == d.op && k.curve == "p99")
            .map(|k| k.concurrency);
        let _ = writeln!(
            out,
            "### {} latency growth (baseline: c={})\n",
            d.op, d.baseline_concurrency
        );
        let phases: Vec<Phase> = Phase::ALL[1..]
            .iter()
            .copied()
            .filter(|p| d.rows.iter().any(|r| r.phases.contains_key(p)))
            .collect();
        let mut cols = vec![
            "Concurrency".to_string(),
            "p50 Multiplier".into(),
            "p99 Multiplier".into(),
        ];
        cols.extend(
            phases
                .iter()
                .map(|p| format!("{} p99 Multiplier", p.name())),
        );
        header(out, &cols);
        for r in &d.rows {
            let bold = knee == Some(r.concurrency);
            let b = |s: String| if bold { format!("**{s}**") } else { s };
            let x = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}x"));
            let step = if r.flagged {
                format!("{} ⚠", r.step)
            } else {
                r.step.clone()
            };
            let mut row = vec![
                b(step),
                b(x(r.phases.get(&Phase::E2e).map(|m| m.p50))),
                b(x(r.phases.get(&Phase::E2e).map(|m| m.p99))),
            ];
            row.extend(phases.iter().map(|p| b(x(r.phases.get(p).map(|m| m.p99)))));
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        if knee.is_some() {
            let _ = writeln!(out, "\nBold: knee of the p99 curve.");
        }
        out.push('\n');
    }
}

fn competitor_tables(out: &mut String, r: &Record) {
    if let Some(n) = &r.network {
        let _ = writeln!(out, "## Network settings\n");
        let _ = writeln!(
            out,
            "System default congestion control: `{}`; kvtier's bench client asked for `{}`.\n",
            n.system_default_cc,
            if n.kvtier_client_cc.is_empty() {
                "the system default"
            } else {
                &n.kvtier_client_cc
            }
        );
        header(
            out,
            &["System", "congestion control seen on its sockets"].map(String::from),
        );
        for (sys, cc) in &n.observed_cc {
            let cc: Vec<&str> = cc.iter().map(String::as_str).collect();
            let _ = writeln!(out, "| {sys} | {} |", cc.join(", "));
        }
        out.push('\n');
    }
    for competitor in &r.competitors {
        competitor_table(out, r, competitor);
    }
    if let Some(a) = r.analysis.as_ref().filter(|a| !a.comparison.is_empty()) {
        fair_table(out, a);
    }
}

fn fair_table(out: &mut String, a: &Analysis) {
    let _ = writeln!(out, "## Comparisons under the rules\n");
    let _ = writeln!(
        out,
        "Equal network settings; the competitor's number is the better of the bench's client and its own tool; \
         medians over repeats; saturated or failing steps get no ratio (docs/bench.md).\n"
    );
    header(
        out,
        &[
            "Step",
            "op",
            "competitor",
            "kvtier ops/s",
            "competitor client ops/s",
            "competitor tool ops/s",
            "denominator",
            "throughput ratio",
            "kvtier p99",
            "competitor p99",
            "p99 ratio",
            "notes",
        ]
        .map(String::from),
    );
    let opt = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.1}"));
    let x = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}x"));
    for c in &a.comparison {
        let mut notes: Vec<String> = c
            .excluded
            .iter()
            .map(|e| format!("excluded: {e}"))
            .collect();
        notes.extend(c.outliers.iter().cloned());
        let _ = writeln!(
            out,
            "| {} | {} | {} {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.step,
            c.op,
            c.competitor,
            c.competitor_op,
            c.kvtier_ops_s,
            opt(c.competitor_client_ops_s),
            opt(c.competitor_tool_ops_s),
            c.competitor_best_source,
            x(c.throughput_ratio),
            ms(c.kvtier_p99_us),
            ms(c.competitor_best_p99_us),
            x(c.p99_ratio),
            notes.join("; ")
        );
    }
    out.push('\n');
}

fn competitor_table(out: &mut String, r: &Record, competitor: &CompetitorRun) {
    let _ = writeln!(out, "## kvtier vs {} (same run)\n", competitor.name);
    if !competitor.client.is_empty() {
        let _ = writeln!(out, "Driven by: {}.\n", competitor.client);
    }
    header(
        out,
        &[
            "Step",
            "kvtier op",
            "competitor op",
            "kvtier ops/s",
            "competitor ops/s",
            "throughput ratio",
            "kvtier p50",
            "competitor p50",
            "kvtier p99",
            "competitor p99",
            "p99 ratio",
        ]
        .map(String::from),
    );
    for s in &r.steps {
        let Some(ps) = competitor.steps.iter().find(|p| p.label() == s.label()) else {
            continue;
        };
        for (kop, pop) in &competitor.op_map {
            let (Some(k), Some(p)) = (s.ops.get(kop), ps.ops.get(pop)) else {
                continue;
            };
            let (ke, pe) = (
                k.phase(Phase::E2e).copied().unwrap_or_default(),
                p.phase(Phase::E2e).copied().unwrap_or_default(),
            );
            let ratio = |a: f64, b: f64| {
                if b > 0.0 {
                    format!("{:.2}x", a / b)
                } else {
                    "–".into()
                }
            };
            let flagged = if ps.flags.is_empty() {
                label(s)
            } else {
                format!("{} ⚠competitor", label(s))
            };
            let _ = writeln!(
                out,
                "| {flagged} | {kop} | {pop} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} |",
                k.throughput_ops_s,
                p.throughput_ops_s,
                ratio(k.throughput_ops_s, p.throughput_ops_s),
                ms(ke.p50),
                ms(pe.p50),
                ms(ke.p99),
                ms(pe.p99),
                ratio(ke.p99, pe.p99)
            );
        }
    }
    let _ = writeln!(
        out,
        "\nRatios are kvtier / {}; throughput > 1x and p99 < 1x favour kvtier.\n",
        competitor.name
    );
    if let Some(rf) = &competitor.reference {
        let _ = writeln!(
            out,
            "### {} measured by its own tool (same run)\n",
            competitor.name
        );
        let _ = writeln!(out, "`{}`\n", rf.tool);
        header(out, &["c", "op", "ops/s", "p50", "p99"].map(String::from));
        for row in &rf.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {} | {} |",
                row.concurrency,
                row.op,
                row.throughput_ops_s,
                ms(row.p50_us),
                ms(row.p99_us)
            );
        }
        out.push('\n');
    }
}

fn analysis_sections(out: &mut String, a: &Analysis) {
    let _ = writeln!(out, "## Scalability (Universal Scalability Law)\n");
    let _ = writeln!(
        out,
        "X(N) = λN / (1 + σ(N−1) + κN(N−1)), N = total concurrency.\n"
    );
    header(
        out,
        &["Op", "λ (ops/s)", "σ", "κ", "Peak N*", "Peak ops/s", "R²"].map(String::from),
    );
    for u in &a.usl {
        let f = &u.fit;
        let opt = |v: Option<f64>, d: usize| v.map_or("–".into(), |v| format!("{v:.d$}"));
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.4} | {:.6} | {} | {} | {:.3} |",
            u.op,
            f.lambda,
            f.sigma,
            f.kappa,
            opt(f.peak_concurrency, 1),
            opt(f.peak_throughput, 1),
            f.r_squared
        );
    }
    let _ = writeln!(out, "\n### Knees\n");
    header(
        out,
        &["Op", "Curve", "Concurrency", "Value"].map(String::from),
    );
    for k in &a.knees {
        let v = if k.curve == "throughput" {
            format!("{:.1} ops/s", k.value)
        } else {
            format!("{} ms", ms(k.value))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            k.op, k.curve, k.concurrency, v
        );
    }
    let _ = writeln!(out, "\n## Recommendations\n");
    header(
        out,
        &[
            "SLA", "Mode", "Max load", "ops/s", "tokens/s", "Measured", "Note",
        ]
        .map(String::from),
    );
    for r in &a.recommendations {
        let measured = r
            .measured_us
            .iter()
            .map(|v| format!("{} ms", ms(*v)))
            .collect::<Vec<_>>()
            .join(", ");
        let note = match (&r.step, r.flagged) {
            (None, _) => "no step meets it",
            (Some(_), true) => "⚠ step is flagged",
            _ => "✓",
        };
        let load = r.step.clone().unwrap_or_else(|| "–".into());
        let opt = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.1}"));
        let _ = writeln!(
            out,
            "| {} | {} | {load} | {} | {} | {measured} | {note} |",
            r.sla,
            r.mode,
            opt(r.throughput_ops_s),
            opt(r.tokens_per_s)
        );
    }
    if !a.capacity.is_empty() {
        let _ = writeln!(
            out,
            "\n## Capacity planning\n\nServers needed = ⌈target tokens/s ÷ per-server tokens/s at the SLA⌉.\n"
        );
        header(
            out,
            &[
                "SLA",
                "Target tokens/s",
                "Per server tokens/s",
                "Per-server load",
                "Servers needed",
            ]
            .map(String::from),
        );
        for c in &a.capacity {
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0} | {} | **{}** |",
                c.sla,
                c.target_tokens_per_s,
                c.per_server_tokens_per_s,
                c.per_server_load,
                c.servers_needed
            );
        }
    }
    let _ = writeln!(
        out,
        "\n## Self-checks\n\n### Little's law (in flight = throughput × mean latency)\n"
    );
    header(
        out,
        &["Step", "Expected", "Predicted", "Ratio", "OK"].map(String::from),
    );
    for l in &a.littles_law {
        let e = l
            .expected_in_flight
            .map_or("–".into(), |e| format!("{e:.2}"));
        let ratio = l.ratio.map_or("–".into(), |r| format!("{r:.2}"));
        let _ = writeln!(
            out,
            "| {} | {e} | {:.2} | {ratio} | {} |",
            l.step,
            l.predicted_in_flight,
            if l.ok { "✓" } else { "⚠" }
        );
    }
    for w in &a.warnings {
        let _ = writeln!(out, "\n- warning: {w}");
    }
    out.push('\n');
}

/// Renders the whole summary.
pub fn render_summary(r: &Record) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# kvtier bench — {} ({})\n", r.workload, r.api);
    let m = &r.machine;
    let _ = writeln!(out, "**Date:** {}  ", r.date);
    let _ = writeln!(
        out,
        "**Commit:** {}  ",
        r.git_commit.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(
        out,
        "**Machine:** {} ({} cores, {:.1} GiB, kernel {})  ",
        m.hostname,
        m.cores,
        m.memory_bytes as f64 / (1u64 << 30) as f64,
        m.kernel
    );
    match &r.cluster {
        Some(c) => {
            let _ = writeln!(
                out,
                "**Target:** a cluster of {} nodes through the node list (R = {}): {}  ",
                c.nodes.len(),
                c.replicas,
                c.nodes.join(", ")
            );
        }
        None => {
            let _ = writeln!(out, "**Target:** {}  ", r.target);
        }
    }
    let _ = writeln!(out, "**Value size:** {} bytes  ", r.value_size);
    let _ = writeln!(out, "**Command:** `{}`\n", r.command_line.join(" "));
    let _ = writeln!(
        out,
        "Latencies in milliseconds. Percentiles come from HdrHistograms merged across processes and repeats. ⚠ marks a flagged step (see Flags).\n"
    );
    let _ = writeln!(out, "## Latency vs load\n");
    latency_tables(&mut out, &r.steps);
    throughput_table(&mut out, r);
    if let Some(a) = &r.analysis {
        degradation_tables(&mut out, a);
    }
    competitor_tables(&mut out, r);
    if let Some(a) = &r.analysis {
        analysis_sections(&mut out, a);
    }
    let flagged: Vec<(String, &Step)> = r
        .steps
        .iter()
        .map(|s| (String::new(), s))
        .chain(
            r.competitors
                .iter()
                .flat_map(|p| p.steps.iter().map(|s| (format!("{} ", p.name), s))),
        )
        .filter(|(_, s)| !s.flags.is_empty())
        .collect();
    let _ = writeln!(out, "## Flags\n");
    if flagged.is_empty() {
        let _ = writeln!(out, "No step was flagged.");
    }
    for (system, s) in flagged {
        for f in &s.flags {
            let _ = writeln!(
                out,
                "- ⚠ **{system}{}** `{}`: {}",
                s.label(),
                f.kind,
                f.message
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze;
    use crate::record::LinkProbe;
    use crate::testutil::{synthetic_record, synthetic_step};

    #[test]
    fn summary_has_seed_style_tables() {
        let mut r = synthetic_record();
        r.link_probe = Some(LinkProbe {
            gbit_per_s: 20.0,
            streams: 1,
            duration_s: 10.0,
            method: "tcp".into(),
        });
        let competitor_steps = r
            .steps
            .iter()
            .map(|s| {
                synthetic_step(
                    s.total_concurrency().unwrap(),
                    &[("get", 5_000.0, 9_000.0, 200.0)],
                )
            })
            .collect();
        r.competitors = vec![CompetitorRun {
            name: "redis".into(),
            op_map: [("read".to_string(), "get".to_string())].into(),
            steps: competitor_steps,
            ..Default::default()
        }];
        r.steps[3].generator_cpu_utilisation = 0.99;
        analyze(&mut r);
        let md = render_summary(&r);
        // c=8: 800 ops/s, p50 10 ms, p99 30 ms; storage half, network 30 %.
        assert!(
            md.contains(
                "| c=8 ⚠ | 800.0 | 10.00 | 20.00 | 30.00 | 36.00 | 5.00 | 15.00 | 3.00 | 9.00 |"
            ),
            "{md}"
        );
        // Degradation at c=16: p50 2x; knee bold at c=8.
        assert!(md.contains("| c=16 | 2.00x | 2.00x |"), "{md}");
        assert!(md.contains("| **c=8 ⚠** | **1.00x** |"), "{md}");
        // Bandwidth: 800 MiB/s = 6.71 Gbit/s = 33.6 % of 20 Gbit/s.
        assert!(md.contains("| **6.71** | 33.6% |"), "{md}");
        // Competitor: 800 vs 200 ops/s at c=8.
        assert!(
            md.contains("| read | get | 800.0 | 200.0 | 4.00x |"),
            "{md}"
        );
        assert!(md.contains("| read.p99 < 40.00ms | closed | c=8 | 800.0 | 102400.0 | 30.00 ms | ⚠ step is flagged |"), "{md}");
        assert!(md.contains("| **10** |"), "{md}");
        assert!(md.contains("- ⚠ **c=8** `client_cpu`"), "{md}");
        assert!(md.contains("- ⚠ **redis c=2** `littles_law`"), "{md}");
        assert!(md.contains("| read | p99 | 8 | 30.00 ms |"), "{md}");
        assert!(md.contains("| c=8 | 8.00 | 8.00 | 1.00 | ✓ |"), "{md}");
        // Under the rules: c=4 compared, c=8 (saturated generator) excluded.
        assert!(
            md.contains("| c=4 | read | redis get | 400.0 | 200.0 | – | client | 2.00x |"),
            "{md}"
        );
        assert!(
            md.contains("| c=8 | read | redis get | 800.0 | 200.0 | – | client | – |"),
            "{md}"
        );
        assert!(
            md.contains("excluded: kvtier generator: generator used 99%"),
            "{md}"
        );
    }
}
