//! `kvtier bench compare A B`: what changed between two perf records.
//!
//! Conditions first (the header: commit, dirty, machine, command, versions,
//! date), because a ratio between runs on different machines or commits
//! means something else than one between repeats of one run (notes/README.md:
//! this machine drifts by up to 1.7× between days). Then the numbers: for two
//! `kvtier bench` records the regression table of
//! [`crate::analysis::compare`]; for any other pair (an A/B record, a
//! script's record under notes/) every numeric value the two records share
//! and that differs, with B / A.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use crate::record::header::{HEADER_KEYS, header_problems};

/// Reads two records and renders what changed (markdown).
pub fn compare_files(a: &Path, b: &Path) -> anyhow::Result<String> {
    let ra = read(a)?;
    let rb = read(b)?;
    let mut out = format!("A: {}\nB: {}\n\n", a.display(), b.display());
    out.push_str(&conditions(&ra, &rb));
    out.push_str("\n## Numbers\n\n");
    let bench = |v: &Value| v.get("schema_version").is_some() && v.get("steps").is_some();
    if bench(&ra) && bench(&rb) {
        let parse = |v: &Value, p: &Path| {
            crate::Record::from_json(&v.to_string())
                .with_context(|| format!("parsing {}", p.display()))
        };
        let (x, y) = (parse(&ra, a)?, parse(&rb, b)?);
        out.push_str(&crate::render_comparison(&crate::compare(&x, &y)));
    } else {
        out.push_str(&numbers(&ra, &rb));
    }
    Ok(out)
}

fn read(p: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {} as JSON", p.display()))?;
    let problems = header_problems(&v);
    if !problems.is_empty() {
        anyhow::bail!(
            "{} has no perf record header ({}): every record starts with {}, so that \
             what ran where can be compared (perf/README.md). A record written before the header \
             gets it with `python3 -m perf.stamp {}`",
            p.display(),
            problems.join("; "),
            HEADER_KEYS.join(", "),
            p.display()
        );
    }
    Ok(v)
}

/// The header side by side: the keys that differ, then those that do not.
pub fn conditions(a: &Value, b: &Value) -> String {
    let mut differ = Vec::new();
    let mut same = Vec::new();
    for k in HEADER_KEYS {
        let (x, y) = (&a[k], &b[k]);
        if let (Value::Object(xo), Value::Object(yo)) = (x, y) {
            let keys: BTreeSet<&String> = xo.keys().chain(yo.keys()).collect();
            for sub in keys {
                let (xs, ys) = (xo.get(sub), yo.get(sub));
                let name = format!("{k}.{sub}");
                if xs == ys {
                    same.push(name);
                } else {
                    differ.push((name, show(xs), show(ys)));
                }
            }
        } else if x == y {
            same.push(k.to_string());
        } else {
            differ.push((k.to_string(), show(Some(x)), show(Some(y))));
        }
    }
    let mut out = String::from("## Conditions\n\n");
    if differ.is_empty() {
        out.push_str("Every header field is the same.\n");
    } else {
        out.push_str("| differs | A | B |\n|---|---|---|\n");
        for (k, x, y) in &differ {
            out.push_str(&format!("| {k} | {} | {} |\n", cell(x), cell(y)));
        }
    }
    if !same.is_empty() {
        out.push_str(&format!("\nSame in both: {}.\n", same.join(", ")));
    }
    out
}

fn show(v: Option<&Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// A markdown table cell: pipes escaped, one line.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Every numeric value both records hold at the same place that differs,
/// with B / A; then how many numbers only one of them holds.
pub fn numbers(a: &Value, b: &Value) -> String {
    let (mut x, mut y) = (BTreeMap::new(), BTreeMap::new());
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            for k in HEADER_KEYS {
                o.remove(k);
            }
        }
        v
    };
    leaves(&strip(a), String::new(), &mut x);
    leaves(&strip(b), String::new(), &mut y);
    let mut out = String::from("| value | A | B | B / A |\n|---|---|---|---|\n");
    let mut changed = 0;
    for (path, va) in &x {
        let Some(vb) = y.get(path) else { continue };
        if va == vb {
            continue;
        }
        changed += 1;
        let ratio = if *va != 0.0 {
            format!("{:.3}", vb / va)
        } else {
            "–".into()
        };
        out.push_str(&format!(
            "| {} | {} | {} | {ratio} |\n",
            cell(path),
            num(*va),
            num(*vb)
        ));
    }
    let only_a = x.keys().filter(|k| !y.contains_key(*k)).count();
    let only_b = y.keys().filter(|k| !x.contains_key(*k)).count();
    let shared = x.len() - only_a;
    let mut tail = format!("\n{changed} of {shared} numbers both records hold differ");
    if only_a + only_b > 0 {
        tail.push_str(&format!(
            "; {only_a} only in A, {only_b} only in B (not compared)"
        ));
    }
    if changed == 0 {
        out = String::new();
    }
    out + &tail + ".\n"
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.4}")
    }
}

/// Fields that name an element of an array of objects (a step, a case, a
/// variant): used in paths instead of its index when they tell every
/// element apart, so that inserted or reordered rows still line up.
const LABELS: [&str; 12] = [
    "case",
    "step",
    "bench",
    "name",
    "path",
    "workload",
    "transport",
    "variant",
    "side",
    "op",
    "label",
    "repeat",
];

fn label(v: &Value) -> Option<String> {
    let o = v.as_object()?;
    let parts: Vec<String> = LABELS
        .iter()
        .filter_map(|k| match o.get(*k)? {
            Value::String(s) => Some(format!("{k}={s}")),
            Value::Number(n) => Some(format!("{k}={n}")),
            _ => None,
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Flattens the numeric leaves of `v` into `path -> value`.
fn leaves(v: &Value, path: String, out: &mut BTreeMap<String, f64>) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                out.insert(path, f);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                leaves(x, p, out);
            }
        }
        Value::Array(items) => {
            let labels: Vec<Option<String>> = items.iter().map(label).collect();
            let unique = labels.iter().all(Option::is_some)
                && labels.iter().collect::<BTreeSet<_>>().len() == labels.len();
            for (i, (x, l)) in items.iter().zip(labels).enumerate() {
                let key = match l {
                    Some(l) if unique => l,
                    _ => i.to_string(),
                };
                leaves(x, format!("{path}[{key}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(commit: &str, ops: f64, extra: Value) -> Value {
        json!({"date": "2026-01-05T12:00:00Z", "commit": commit, "dirty": false,
               "machine": {"cores": 2, "kernel": "6.1"}, "command": "x", "versions": {"kvtier": "0.1.0"},
               "rows": [{"step": "c=1", "ops_s": ops}, {"step": "c=8", "ops_s": 10.0}], "extra": extra})
    }

    #[test]
    fn conditions_list_what_differs_then_what_is_the_same() {
        let a = rec("aaaa", 100.0, json!(1));
        let mut b = rec("bbbb", 100.0, json!(1));
        b["machine"]["kernel"] = json!("6.8");
        let c = conditions(&a, &b);
        assert!(c.contains("| commit | aaaa | bbbb |"), "{c}");
        assert!(c.contains("| machine.kernel | 6.1 | 6.8 |"), "{c}");
        assert!(
            c.contains("Same in both: date, dirty, machine.cores, command, versions.kvtier."),
            "{c}"
        );
    }

    #[test]
    fn numbers_line_up_rows_by_their_label_and_give_ratios() {
        let a = rec("aaaa", 100.0, json!(1));
        let mut b = rec("bbbb", 125.0, json!("text"));
        // Rows reordered: matched by their step, not their index.
        b["rows"].as_array_mut().unwrap().reverse();
        let n = numbers(&a, &b);
        assert!(
            n.contains("| rows[step=c=1].ops_s | 100 | 125 | 1.250 |"),
            "{n}"
        );
        assert!(!n.contains("c=8"), "{n}");
        assert!(
            n.contains("1 of 2 numbers both records hold differ; 1 only in A, 0 only in B"),
            "{n}"
        );
    }
}
