//! From the repeats of both sides to the A/B's figures: each metric's values
//! per side, their median and range, the repeats far from the median, and
//! head / base of the medians; rendered as `summary.md`.
//!
//! Medians, not means, so one repeat in a slow phase of this shared machine
//! does not move the result; a repeat outside 0.75–1.33× its side's median
//! is listed, never dropped (docs/bench.md, "Comparisons", rule 4; the same
//! bounds as perf/ab.py).

use serde::Serialize;

use super::side::Outcome;
use crate::record::{Phase, Spread};

/// A repeat below LOW or above HIGH times its side's median is an outlier.
const LOW: f64 = 0.75;
/// See [`LOW`].
const HIGH: f64 = 1.33;

/// One side's values of one metric.
#[derive(Debug, Clone, Serialize)]
pub struct SideValues {
    /// Median of the repeats.
    pub median: f64,
    /// Smallest and largest repeat.
    pub min: f64,
    /// See `min`.
    pub max: f64,
    /// Every repeat's value, in repeat order.
    pub repeats: Vec<f64>,
    /// Repeats (0-based) outside 0.75–1.33× the median.
    pub outliers: Vec<usize>,
}

impl SideValues {
    fn of(values: Vec<f64>) -> Self {
        let s = Spread::of(&values);
        let outliers = values
            .iter()
            .enumerate()
            .filter(|(_, v)| s.median != 0.0 && !(LOW..=HIGH).contains(&(*v / s.median)))
            .map(|(i, _)| i)
            .collect();
        SideValues {
            median: s.median,
            min: s.min,
            max: s.max,
            repeats: values,
            outliers,
        }
    }
}

/// One metric on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    /// `c=1 read ops/s`, `c=8 write p99 µs`, `server peak RSS MiB`.
    pub name: String,
    /// Which way is better: `higher` or `lower`.
    pub better: &'static str,
    /// The base side.
    pub base: SideValues,
    /// The head side.
    pub head: SideValues,
    /// head / base of the medians (`None` when the base's is 0).
    pub ratio: Option<f64>,
    /// Why the ratio may not measure the server: a saturated generator, errors.
    pub flags: Vec<String>,
}

/// A metric's value in one repeat: its name, which way is better, the value.
type Figure = (String, &'static str, f64);
/// A metric's name and a reason its ratio may not measure the server.
type Note = (String, String);

/// The figures of one repeat in the record's order, and flags by name.
fn figures(o: &Outcome) -> (Vec<Figure>, Vec<Note>) {
    let mut out = Vec::new();
    let mut flags = Vec::new();
    for s in &o.record.steps {
        let label = s.label();
        let saturated =
            s.generator_cpu_utilisation >= 0.9 || s.flags.iter().any(|f| f.kind == "client_cpu");
        for (op, st) in &s.ops {
            let e2e = st.phase(Phase::E2e).copied().unwrap_or_default();
            let names = [
                (format!("{label} {op} ops/s"), "higher", st.throughput_ops_s),
                (format!("{label} {op} p50 µs"), "lower", e2e.p50),
                (format!("{label} {op} p99 µs"), "lower", e2e.p99),
            ];
            for (name, better, v) in names {
                if saturated {
                    flags.push((
                        name.clone(),
                        format!(
                            "generator saturated (CPU {:.2})",
                            s.generator_cpu_utilisation
                        ),
                    ));
                }
                if st.errors > 0 {
                    flags.push((name.clone(), format!("{} errors", st.errors)));
                }
                out.push((name, better, v));
            }
        }
    }
    if let Some(r) = o.server_peak_rss_mib {
        out.push(("server peak RSS MiB".into(), "lower", r));
    }
    (out, flags)
}

/// Every metric both sides measured, in the record's order.
pub fn metrics(base: &[Outcome], head: &[Outcome]) -> Vec<Metric> {
    let side = |runs: &[Outcome]| {
        let mut names: Vec<(String, &'static str)> = Vec::new();
        let mut values: std::collections::HashMap<String, Vec<f64>> = Default::default();
        let mut flags: Vec<(String, String)> = Vec::new();
        for o in runs {
            let (f, fl) = figures(o);
            for (name, better, v) in f {
                if !values.contains_key(&name) {
                    names.push((name.clone(), better));
                }
                values.entry(name).or_default().push(v);
            }
            flags.extend(fl);
        }
        (names, values, flags)
    };
    let (names, mut bv, bf) = side(base);
    let (_, mut hv, hf) = side(head);
    let mut out = Vec::new();
    for (name, better) in names {
        let (Some(b), Some(h)) = (bv.remove(&name), hv.remove(&name)) else {
            continue;
        };
        let (b, h) = (SideValues::of(b), SideValues::of(h));
        let mut flags: Vec<String> = Vec::new();
        for (side, fl) in [("base", &bf), ("head", &hf)] {
            for (n, f) in fl.iter() {
                let f = format!("{side}: {f}");
                if *n == name && !flags.contains(&f) {
                    flags.push(f);
                }
            }
        }
        out.push(Metric {
            name,
            better,
            ratio: (b.median != 0.0).then(|| h.median / b.median),
            base: b,
            head: h,
            flags,
        });
    }
    out
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The table of `summary.md`.
pub fn render(rec: &super::AbRecord) -> String {
    let side = |b: &super::build::Binary| {
        let commit = b.commit.as_deref().map_or("?", |c| &c[..c.len().min(10)]);
        let dirty = if b.dirty == Some(true) { ", dirty" } else { "" };
        format!("`{}` ({commit}{dirty}; {})", b.rev, b.how)
    };
    let mut out = format!(
        "# kvtier bench ab\n\nBase {}, head {}{}; {} alternating repeats ({}); generator: {}; `{}`.\n\n",
        side(&rec.base.binary),
        side(&rec.head.binary),
        if rec.head.variants.is_empty() {
            String::new()
        } else {
            format!(", head with {}", rec.head.variants.join(" "))
        },
        rec.repeats,
        rec.order.join(" "),
        match rec.generator {
            super::Generator::Head => "the head's binary for both",
            super::Generator::Own => "each side's own binary",
        },
        rec.header.command,
    );
    out.push_str(
        "| metric | base median (min–max) | head median (min–max) | head / base | notes |\n\
         |---|---|---|---|---|\n",
    );
    for m in &rec.metrics {
        let v = |s: &SideValues| format!("{} ({}–{})", num(s.median), num(s.min), num(s.max));
        let mut notes = m.flags.clone();
        for (side, s) in [("base", &m.base), ("head", &m.head)] {
            for i in &s.outliers {
                notes.push(format!(
                    "{side} repeat {}: {:.2}× its median",
                    i + 1,
                    s.repeats[*i] / s.median
                ));
            }
        }
        out.push_str(&format!(
            "| {} ({} is better) | {} | {} | {} | {} |\n",
            m.name,
            m.better,
            v(&m.base),
            v(&m.head),
            m.ratio.map_or("–".into(), |r| format!("{r:.3}")),
            notes.join("; ")
        ));
    }
    out
}
