//! `kvtier bench compare A B`: a regression table between two records.
//!
//! Rows are matched by step label (`c=8`, `rate=500/s`) and op name; for each
//! the end-to-end p50/p90/p99/p999 and the throughput are compared. The shown
//! values come from the merged histograms; significance uses the per-repeat
//! values:
//!
//! * **Mann–Whitney U** (exact, two-sided, α = 0.05) when the repeat counts
//!   can reach p ≤ 0.05 at all (e.g. 4 vs 4; 3 vs 3 cannot: its smallest
//!   p-value is 0.1). Ties are counted as ½ and the untied null distribution
//!   is used.
//! * otherwise **ranges**: with ≥ 2 repeats on each side, a change is
//!   significant when the [min, max] ranges of A and B do not overlap.
//! * with a single repeat on either side nothing is claimed (`untested`).

use serde::{Deserialize, Serialize};

use crate::record::{OpStats, Phase, Record};

/// Significance level of the Mann–Whitney test.
pub const ALPHA: f64 = 0.05;

/// Outcome of one comparison row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// B is significantly worse (slower or lower throughput).
    Regression,
    /// B is significantly better.
    Improvement,
    /// No significant difference given the repeats.
    NoChange,
    /// Too few repeats to test.
    Untested,
}

/// One (step, op, statistic) row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    /// Step label.
    pub step: String,
    /// Op name.
    pub op: String,
    /// `p50`, `p90`, `p99`, `p999` (µs) or `throughput` (ops/s).
    pub stat: String,
    /// Value in A (merged histogram / total).
    pub a: f64,
    /// Value in B.
    pub b: f64,
    /// b / a.
    pub ratio: f64,
    /// `mann-whitney`, `ranges` or `none`.
    pub method: String,
    /// Mann–Whitney two-sided p-value, when that method was used.
    pub p_value: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// `date commit` of A.
    pub a: String,
    /// `date commit` of B.
    pub b: String,
    /// Rows, in A's step order.
    pub rows: Vec<CompareRow>,
    /// Steps or ops present in only one record.
    pub unmatched: Vec<String>,
}

/// Number of arrangements giving each U (0..=n1·n2) for sample sizes n1, n2 without ties.
fn u_distribution(n1: usize, n2: usize) -> Vec<f64> {
    // f[i][j][u]: arrangements of i A-values and j B-values with statistic u.
    let mut f = vec![vec![vec![0f64; n1 * n2 + 1]; n2 + 1]; n1 + 1];
    for (i, fi) in f.iter_mut().enumerate() {
        for (j, fij) in fi.iter_mut().enumerate() {
            if i == 0 || j == 0 {
                fij[0] = 1.0;
            }
        }
    }
    for i in 1..=n1 {
        for j in 1..=n2 {
            for u in 0..=i * j {
                // Largest value is from A (adds j to U: it beats all j B-values) or from B.
                let from_a = if u >= j { f[i - 1][j][u - j] } else { 0.0 };
                let from_b = f[i][j - 1][u];
                f[i][j][u] = from_a + from_b;
            }
        }
    }
    f[n1][n2].clone()
}

/// Exact two-sided Mann–Whitney p-value for samples `a` and `b`.
pub fn mann_whitney_p(a: &[f64], b: &[f64]) -> f64 {
    let u: f64 = a
        .iter()
        .map(|x| {
            b.iter()
                .map(|y| {
                    if x > y {
                        1.0
                    } else if x == y {
                        0.5
                    } else {
                        0.0
                    }
                })
                .sum::<f64>()
        })
        .sum();
    let dist = u_distribution(a.len(), b.len());
    let total: f64 = dist.iter().sum();
    let le: f64 = dist
        .iter()
        .enumerate()
        .filter(|(k, _)| *k as f64 <= u + 1e-9)
        .map(|(_, c)| c)
        .sum();
    let ge: f64 = dist
        .iter()
        .enumerate()
        .filter(|(k, _)| *k as f64 >= u - 1e-9)
        .map(|(_, c)| c)
        .sum();
    (2.0 * le.min(ge) / total).min(1.0)
}

/// Smallest two-sided p-value reachable with these sample sizes.
fn min_p(n1: usize, n2: usize) -> f64 {
    if n1 == 0 || n2 == 0 {
        return 1.0;
    }
    2.0 / u_distribution(n1, n2).iter().sum::<f64>()
}

/// Significance of B vs A per the module's rules: `(method, p_value, significant)`.
pub fn significance(a: &[f64], b: &[f64]) -> (String, Option<f64>, bool) {
    if min_p(a.len(), b.len()) <= ALPHA {
        let p = mann_whitney_p(a, b);
        ("mann-whitney".into(), Some(p), p <= ALPHA)
    } else if a.len() >= 2 && b.len() >= 2 {
        let (amin, amax) = a
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
                (l.min(*x), h.max(*x))
            });
        let (bmin, bmax) = b
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
                (l.min(*x), h.max(*x))
            });
        ("ranges".into(), None, amax < bmin || bmax < amin)
    } else {
        ("none".into(), None, false)
    }
}

fn stat_values(op: &OpStats, stat: &str) -> (f64, Vec<f64>) {
    if stat == "throughput" {
        (
            op.throughput_ops_s,
            op.per_repeat.iter().map(|r| r.throughput_ops_s).collect(),
        )
    } else {
        let merged = op
            .phase(Phase::E2e)
            .and_then(|p| p.get(stat))
            .unwrap_or(0.0);
        (
            merged,
            op.per_repeat
                .iter()
                .filter_map(|r| r.e2e_us.get(stat))
                .collect(),
        )
    }
}

/// Compares B against A (see the module docs for the method).
pub fn compare(a: &Record, b: &Record) -> Comparison {
    let id = |r: &Record| {
        format!(
            "{} {}",
            r.date,
            r.git_commit.as_deref().unwrap_or("unknown-commit")
        )
    };
    let mut rows = Vec::new();
    let mut unmatched = Vec::new();
    for sa in &a.steps {
        let Some(sb) = b.steps.iter().find(|s| s.label() == sa.label()) else {
            unmatched.push(format!("step {} only in A", sa.label()));
            continue;
        };
        for (name, oa) in &sa.ops {
            let Some(ob) = sb.ops.get(name) else {
                unmatched.push(format!("{name} at {} only in A", sa.label()));
                continue;
            };
            for stat in ["throughput", "p50", "p90", "p99", "p999"] {
                let (va, ra) = stat_values(oa, stat);
                let (vb, rb) = stat_values(ob, stat);
                let (method, p_value, significant) = significance(&ra, &rb);
                let worse = if stat == "throughput" {
                    vb < va
                } else {
                    vb > va
                };
                let verdict = match (method.as_str(), significant, worse) {
                    ("none", _, _) => Verdict::Untested,
                    (_, false, _) => Verdict::NoChange,
                    (_, true, true) => Verdict::Regression,
                    (_, true, false) => Verdict::Improvement,
                };
                let ratio = if va > 0.0 { vb / va } else { f64::NAN };
                rows.push(CompareRow {
                    step: sa.label(),
                    op: name.clone(),
                    stat: stat.into(),
                    a: va,
                    b: vb,
                    ratio,
                    method,
                    p_value,
                    verdict,
                });
            }
        }
    }
    for sb in &b.steps {
        if !a.steps.iter().any(|s| s.label() == sb.label()) {
            unmatched.push(format!("step {} only in B", sb.label()));
        }
    }
    Comparison {
        a: id(a),
        b: id(b),
        rows,
        unmatched,
    }
}

/// Renders the comparison as a markdown table.
pub fn render_comparison(c: &Comparison) -> String {
    let mut s = format!(
        "# kvtier bench compare\n\n**A:** {}  \n**B:** {}\n\n",
        c.a, c.b
    );
    s.push_str("Significance: exact two-sided Mann–Whitney U on per-repeat values (α = 0.05) where the repeat counts allow it, otherwise non-overlapping [min, max] ranges across repeats; single repeats are untested.\n\n");
    s.push_str("| Step | Op | Stat | A | B | B/A | Method | p | Verdict |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in &c.rows {
        let fmt = |v: f64| {
            if r.stat == "throughput" {
                format!("{v:.1}/s")
            } else {
                crate::analysis::sla::fmt_ms(v)
            }
        };
        let verdict = match r.verdict {
            Verdict::Regression => "**regression**",
            Verdict::Improvement => "improvement",
            Verdict::NoChange => "no change",
            Verdict::Untested => "untested",
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2}x | {} | {} | {} |\n",
            r.step,
            r.op,
            r.stat,
            fmt(r.a),
            fmt(r.b),
            r.ratio,
            r.method,
            r.p_value.map_or("–".into(), |p| format!("{p:.3}")),
            verdict
        ));
    }
    for u in &c.unmatched {
        s.push_str(&format!("\n- unmatched: {u}"));
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RepeatOp;
    use crate::testutil::{pct, synthetic_record};

    #[test]
    fn mann_whitney_exact_values() {
        // Complete separation of 4 vs 4: p = 2/70.
        let p = mann_whitney_p(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]);
        assert!((p - 2.0 / 70.0).abs() < 1e-12, "{p}");
        // Interleaved: not significant.
        assert!(mann_whitney_p(&[1.0, 3.0, 5.0, 7.0], &[2.0, 4.0, 6.0, 8.0]) > 0.5);
        assert!((min_p(3, 3) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn significance_methods_by_repeat_count() {
        assert_eq!(significance(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).0, "ranges");
        assert!(significance(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).2);
        assert!(!significance(&[1.0, 5.0, 3.0], &[4.0, 5.0, 6.0]).2);
        assert_eq!(significance(&[1.0], &[2.0]).0, "none");
        let (m, p, sig) = significance(&[1.0, 2.0, 3.0, 4.0, 5.0], &[6.0, 7.0, 8.0, 9.0, 10.0]);
        assert_eq!(m, "mann-whitney");
        assert!(sig && p.unwrap() < 0.01);
    }

    #[test]
    fn detects_regression_and_no_change() {
        let mut a = synthetic_record();
        a.steps.truncate(2);
        for s in &mut a.steps {
            let op = s.ops.get_mut("read").unwrap();
            let base = op.latency_us[&Phase::E2e];
            op.per_repeat = (0..4)
                .map(|i| RepeatOp {
                    repeat: i,
                    throughput_ops_s: op.throughput_ops_s + f64::from(i),
                    e2e_us: pct(
                        base.p50 + f64::from(i) * 10.0,
                        base.p99 + f64::from(i) * 10.0,
                    ),
                })
                .collect();
        }
        let mut b = a.clone();
        // B: c=1 p50 50 % slower in every repeat; c=2 unchanged.
        let op = b.steps[0].ops.get_mut("read").unwrap();
        op.latency_us.get_mut(&Phase::E2e).unwrap().p50 *= 1.5;
        for r in &mut op.per_repeat {
            r.e2e_us.p50 *= 1.5;
        }
        let c = compare(&a, &b);
        let row = |step: &str, stat: &str| {
            c.rows
                .iter()
                .find(|r| r.step == step && r.stat == stat)
                .unwrap()
                .clone()
        };
        assert_eq!(row("c=1", "p50").verdict, Verdict::Regression);
        assert!((row("c=1", "p50").ratio - 1.5).abs() < 1e-9);
        assert_eq!(row("c=1", "p99").verdict, Verdict::NoChange);
        assert_eq!(row("c=2", "throughput").verdict, Verdict::NoChange);
        let md = render_comparison(&c);
        assert!(
            md.contains("| c=1 | read | p50 |") && md.contains("**regression**"),
            "{md}"
        );
    }
}
