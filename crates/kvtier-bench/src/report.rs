//! Renders `report.html`: one self-contained file with interactive charts.
//!
//! The record is embedded as JSON in a `<script type="application/json">`
//! element and drawn by a small hand-written vanilla JS library
//! (`report.js`, inline SVG, hover tooltips, clickable legends, log-y
//! toggle). Nothing is fetched: no CDN, no external `src`/`href`, works
//! offline. SVG is built as markup (no namespace URLs).
//!
//! For headless tests: every drawn chart's `<svg>` has `data-rendered="1"`;
//! when done the page sets `document.body.dataset.chartsRendered` to the
//! number of charts drawn and `chartErrors` to the number that failed;
//! `<body data-charts-expected="N">` says how many to expect
//! ([`expected_charts`]).

use crate::record::{Phase, Record, Step};
use crate::summary::op_names;

const SCRIPT: &str = include_str!("report.js");

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h3{margin:4px 0;font-size:15px}.meta td{padding:2px 12px 2px 0}
.chart{border:1px solid #ddd;border-radius:6px;padding:10px;margin:14px 0}
.legend{margin:4px 0 6px}.leg{cursor:pointer;margin-right:14px;user-select:none;white-space:nowrap}
.leg i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;border-radius:2px}
.leg.off{opacity:.35;text-decoration:line-through}.tool{margin-left:8px;font-size:12px}
svg text{font-size:11px;fill:#444}.grid{stroke:#eee}.axis{stroke:#888}.lbl{font-size:12px;fill:#222}
circle.flagged{stroke:#000;stroke-width:2}.note{font-size:12px;color:#666;margin:2px 0}.err{color:#b00}
#tip{position:absolute;display:none;background:#222;color:#fff;padding:4px 8px;border-radius:4px;font-size:12px;pointer-events:none;white-space:nowrap}
.flags li{color:#8a4b00}
table.t{border-collapse:collapse;margin:6px 0 14px}table.t td,table.t th{border:1px solid #ddd;padding:3px 8px;text-align:right}
table.t th{background:#f5f5f5}table.t td:first-child{text-align:left}h2{font-size:18px;margin-top:22px}";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Number of charts `report.js` draws for this record (mirrors its logic).
pub fn expected_charts(r: &Record) -> usize {
    let closed: Vec<&Step> = r
        .steps
        .iter()
        .filter(|s| s.total_concurrency().is_some())
        .collect();
    let open = r.steps.len() - closed.len();
    let ops = op_names(&r.steps);
    let mut n = 0;
    if !closed.is_empty() {
        n += ops.len() + 1; // percentiles per op, throughput
        let stackable = [
            Phase::ClientQueue,
            Phase::Network,
            Phase::ServerQueue,
            Phase::ServerService,
            Phase::Storage,
        ];
        n += ops
            .iter()
            .filter(|op| {
                closed.iter().any(|s| {
                    s.ops
                        .get(*op)
                        .is_some_and(|o| stackable.iter().any(|p| o.latency_us.contains_key(p)))
                })
            })
            .count();
    }
    if !r.steps.is_empty() {
        n += 1; // bandwidth
    }
    for p in r.competitors.iter().filter(|p| !p.steps.is_empty()) {
        n += 3 * p.op_map.len();
    }
    if open > 0 {
        n += ops.len();
    }
    n
}

/// Renders the self-contained HTML report.
pub fn render_report(r: &Record) -> anyhow::Result<String> {
    // `<` only occurs inside JSON strings, where `\u003c` is equivalent; this keeps `</script>` out.
    let json = serde_json::to_string(r)?.replace('<', "\\u003c");
    let mut meta = String::new();
    let m = &r.machine;
    for (k, v) in [
        ("Date", r.date.clone()),
        (
            "Commit",
            r.git_commit.clone().unwrap_or_else(|| "unknown".into()),
        ),
        (
            "Machine",
            format!(
                "{} — {} cores, {:.1} GiB, kernel {}",
                m.hostname,
                m.cores,
                m.memory_bytes as f64 / (1u64 << 30) as f64,
                m.kernel
            ),
        ),
        (
            "Workload",
            format!(
                "{} over {}, value size {} bytes",
                r.workload, r.api, r.value_size
            ),
        ),
        ("Target", r.target.clone()),
        ("Command", r.command_line.join(" ")),
        (
            "TCP probe",
            r.link_probe.as_ref().map_or("not measured".into(), |l| {
                format!("{:.2} Gbit/s — {}", l.gbit_per_s, l.method)
            }),
        ),
        (
            "Competitors",
            if r.competitors.is_empty() {
                "none".into()
            } else {
                r.competitors
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
    ] {
        meta.push_str(&format!("<tr><td><b>{k}</b></td><td>{}</td></tr>", esc(&v)));
    }
    let mut flags = String::new();
    for s in &r.steps {
        for f in &s.flags {
            flags.push_str(&format!(
                "<li><b>{}</b> <code>{}</code>: {}</li>",
                esc(&s.label()),
                esc(&f.kind),
                esc(&f.message)
            ));
        }
    }
    if flags.is_empty() {
        flags.push_str("<li>No step was flagged.</li>");
    }
    let tables = tables_html(r);
    Ok(format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kvtier bench — {title}</title>\n<style>{STYLE}</style></head>\n\
<body data-charts-expected=\"{expected}\">\n<h1>kvtier bench — {title}</h1>\n<table class=\"meta\">{meta}</table>\n\
<p>Latency percentiles come from HdrHistograms merged across processes and repeats. Large ringed points are flagged steps. \
Click legend entries to hide series; hover points for values. The full record is embedded below and in <code>record.json</code>.</p>\n\
<h2>Summary</h2>\n{tables}\n<h2>Flags</h2><ul class=\"flags\">{flags}</ul>\n<h2>Charts</h2><div id=\"charts\"></div><div id=\"tip\"></div>\n\
<script type=\"application/json\" id=\"record\">{json}</script>\n<script>{SCRIPT}</script>\n</body></html>\n",
        title = esc(&format!("{} ({})", r.workload, r.api)),
        expected = expected_charts(r),
    ))
}

/// The seeds' reports lead with tables: one per operation, a row per load
/// step (throughput, end-to-end percentiles, errors, flags), plus the competitor's
/// numbers next to kvtier's when the run had one.
fn tables_html(r: &Record) -> String {
    let ms = |us: f64| format!("{:.2}", us / 1000.0);
    let mut out = String::new();
    let mut steps: Vec<&Step> = r.steps.iter().collect();
    steps.sort_by(|a, b| {
        a.total_concurrency()
            .unwrap_or(0)
            .cmp(&b.total_concurrency().unwrap_or(0))
    });
    for op in op_names(&r.steps) {
        out.push_str(&format!(
            "<h3>{}</h3><table class=\"t\"><tr><th>load</th><th>ops/s</th><th>MB/s</th><th>p50 ms</th>\
             <th>p90 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>errors</th><th>flags</th></tr>",
            esc(&op)
        ));
        for s in &steps {
            let Some(o) = s.ops.get(&op) else { continue };
            let p = o.phase(Phase::E2e);
            let cell =
                |f: fn(&crate::record::Percentiles) -> f64| p.map_or("–".into(), |p| ms(f(p)));
            let flags: Vec<&str> = s.flags.iter().map(|f| f.kind.as_str()).collect();
            out.push_str(&format!(
                "<tr><td>{}</td><td>{:.0}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&s.label()),
                o.throughput_ops_s,
                o.bytes_per_s / 1e6,
                cell(|p| p.p50),
                cell(|p| p.p90),
                cell(|p| p.p99),
                cell(|p| p.p999),
                o.errors,
                esc(&flags.join(", "))
            ));
        }
        out.push_str("</table>");
    }
    for competitor in r.competitors.iter().filter(|p| !p.steps.is_empty()) {
        for (kop, pop) in &competitor.op_map {
            out.push_str(&format!(
                "<h3>kvtier {} vs {} {}</h3><table class=\"t\"><tr><th>load</th><th>kvtier ops/s</th>\
                 <th>{} ops/s</th><th>ratio</th><th>kvtier p99 ms</th><th>{} p99 ms</th></tr>",
                esc(kop),
                esc(&competitor.name),
                esc(pop),
                esc(&competitor.name),
                esc(&competitor.name)
            ));
            for s in &steps {
                let Some(k) = s.ops.get(kop) else { continue };
                let Some(ps) = competitor
                    .steps
                    .iter()
                    .find(|p| p.total_concurrency() == s.total_concurrency())
                else {
                    continue;
                };
                let Some(p) = ps.ops.get(pop) else { continue };
                let p99 = |o: &crate::record::OpStats| {
                    o.phase(Phase::E2e).map_or("–".into(), |p| ms(p.p99))
                };
                out.push_str(&format!(
                    "<tr><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.2}×</td><td>{}</td><td>{}</td></tr>",
                    esc(&s.label()),
                    k.throughput_ops_s,
                    p.throughput_ops_s,
                    k.throughput_ops_s / p.throughput_ops_s.max(1e-9),
                    p99(k),
                    p99(p)
                ));
            }
            out.push_str("</table>");
        }
    }
    out
}

/// Extracts the embedded record JSON from a rendered report (for tests and tools).
pub fn embedded_json(html: &str) -> Option<&str> {
    let start = html.find("id=\"record\">")? + "id=\"record\">".len();
    let len = html[start..].find("</script>")?;
    Some(&html[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze;
    use crate::record::{CompetitorRun, LinkProbe};
    use crate::testutil::{synthetic_record, synthetic_step};

    fn record() -> Record {
        let mut r = synthetic_record();
        r.command_line.push("--note=</script><b>x</b>".into());
        r.link_probe = Some(LinkProbe {
            gbit_per_s: 20.0,
            streams: 1,
            duration_s: 10.0,
            method: "tcp".into(),
        });
        let competitor = r
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
            steps: competitor,
            ..Default::default()
        }];
        analyze(&mut r);
        r
    }

    #[test]
    fn embeds_record_json_that_round_trips() {
        let r = record();
        let html = render_report(&r).unwrap();
        let json = embedded_json(&html).unwrap();
        assert!(!json.contains('<'));
        let back = Record::from_json(json).unwrap();
        assert_eq!(back.steps.len(), r.steps.len());
        assert_eq!(back.command_line, r.command_line);
        assert_eq!(back.analysis, r.analysis);
    }

    #[test]
    fn self_contained_without_external_references() {
        let html = render_report(&record()).unwrap();
        for bad in [
            "http://",
            "https://",
            " src=",
            "href=",
            "url(",
            "@import",
            "fetch(",
            "XMLHttpRequest",
        ] {
            assert!(!html.contains(bad), "report contains {bad}");
        }
        assert_eq!(html.matches("<script").count(), 2);
        assert!(html.contains("chartsRendered") && html.contains("data-rendered"));
    }

    #[test]
    fn expected_chart_count() {
        // 1 op: percentiles + throughput + phase stack + bandwidth + 3 competitor charts.
        let r = record();
        assert_eq!(expected_charts(&r), 7);
        assert!(
            render_report(&r)
                .unwrap()
                .contains("data-charts-expected=\"7\"")
        );
    }
}
