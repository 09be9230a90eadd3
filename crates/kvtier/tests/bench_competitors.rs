//! `kvtier bench` with competitors in the same run: Redis (its RESP client,
//! redis-rs and redis-benchmark) under the comparison rules, and Mooncake
//! Store through its own Python API (docs/bench.md, "Comparisons").
use std::process::Command;

use kvtier_bench::record::{Phase, Record};

mod bench_common;
mod common;

use bench_common::{bench, plausible, tmp};
use common::BIN;

#[test]
fn redis_competitor_runs_interleaved() {
    assert!(
        Command::new("redis-server")
            .arg("--version")
            .output()
            .is_ok(),
        "redis-server is not installed (scripts/setup.sh --test installs it)"
    );
    let out = tmp("competitor");
    let r = bench(
        &out,
        &[
            "--workload",
            "mixed",
            "--value-size",
            "16KB",
            "--concurrency",
            "1,2",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--competitor",
            "redis://spawn",
            "--probe",
        ],
    );
    plausible(&r, &["lookup", "read", "write"]);
    assert_eq!(r.competitors.len(), 1);
    let competitor = &r.competitors[0];
    assert!(competitor.name.starts_with("redis "), "{}", competitor.name);
    assert_eq!(competitor.steps.len(), r.steps.len());
    for s in &competitor.steps {
        for op in ["exists", "get", "set"] {
            let o = &s.ops[op];
            assert!(
                o.ops > 0 && o.errors == 0,
                "redis {op}: {} ops {} errors",
                o.ops,
                o.errors
            );
        }
    }
    assert!(r.link_probe.as_ref().is_some_and(|p| p.gbit_per_s > 0.0));
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("redis"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Comparison rules 1–3 end to end: the congestion control of both systems'
/// sockets is observed, redis-benchmark runs next to the bench's client, and
/// every ratio uses the better of the two.
#[test]
fn competitor_comparisons_follow_the_rules() {
    for tool in ["redis-server", "redis-benchmark", "ss"] {
        assert!(
            Command::new(tool).arg("--version").output().is_ok(),
            "{tool} is not installed (scripts/setup.sh --test installs it)"
        );
    }
    let out = tmp("rules");
    let r = bench(
        &out,
        &[
            "--workload",
            "read",
            "--value-size",
            "64KB",
            "--concurrency",
            "1,4",
            "--duration",
            "400ms",
            "--warmup",
            "100ms",
            "--repeat",
            "2",
            "--competitor",
            "redis://spawn",
            "--competitor-tool",
        ],
    );
    let net = r.network.as_ref().expect("network settings recorded");
    let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap();
    assert_eq!(net.system_default_cc, system.trim());
    assert_eq!(
        net.kvtier_client_cc, "",
        "the bench's default is the system's"
    );
    let competitor = &r.competitors[0];
    // Both systems seen under load, on the same (system default) congestion control.
    let seen = |s: &str| net.observed_cc.get(s).cloned().unwrap_or_default();
    assert!(!seen("kvtier").is_empty(), "{net:?}");
    assert_eq!(seen("kvtier"), seen(&competitor.name), "{net:?}");
    assert!(seen("kvtier").contains(system.trim()), "{net:?}");
    let rf = competitor.reference.as_ref().expect("redis-benchmark ran");
    assert!(rf.tool.contains("-r 1000000000"), "{}", rf.tool);
    let a = r.analysis.as_ref().unwrap();
    assert_eq!(a.comparison.len(), 2, "{:?}", a.comparison);
    for c in &a.comparison {
        assert_eq!((c.op.as_str(), c.competitor_op.as_str()), ("read", "get"));
        assert_eq!(c.kvtier_repeats_ops_s.len(), 2);
        let client = c.competitor_client_ops_s.expect("client measured");
        let tool = c.competitor_tool_ops_s.expect("tool measured");
        assert_eq!(c.competitor_best_ops_s, client.max(tool), "{c:?}");
        match c.throughput_ratio {
            Some(x) => {
                assert!(c.excluded.is_empty());
                assert!((x - c.kvtier_ops_s / c.competitor_best_ops_s).abs() < 1e-9);
            }
            None => assert!(!c.excluded.is_empty(), "no ratio and no reason: {c:?}"),
        }
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("## Comparisons under the rules"), "{md}");
    assert!(md.contains("## Network settings"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Mooncake Store as a competitor (rule 5): spawned by the bench, driven through
/// its own Python API from a separate process, in the same run and with the
/// same value size; its steps get their own ratio rows.
#[test]
fn mooncake_competitor_runs_in_the_same_run() {
    let python =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/mooncake/bin/python");
    assert!(
        kvtier_bench::competitors::mooncake::available(&python),
        "Mooncake Store is not installed: scripts/setup-mooncake.sh (make test runs it)"
    );
    let out = tmp("mooncake");
    let o = Command::new(BIN)
        .args(["bench", "--workload", "write", "--value-size", "256KB"])
        .args([
            "--concurrency",
            "1,2",
            "--duration",
            "500ms",
            "--warmup",
            "200ms",
        ])
        .args(["--competitor", "mooncake://spawn", "--quiet", "--out"])
        .arg(&out)
        .env("KVTIER_MOONCAKE_PYTHON", &python)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run kvtier bench");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = Record::from_json(&std::fs::read_to_string(out.join("record.json")).unwrap()).unwrap();
    let competitor = &r.competitors[0];
    assert!(
        competitor.name.starts_with("mooncake-store "),
        "{}",
        competitor.name
    );
    assert!(
        competitor.client.contains("put_from") || competitor.client.contains("put"),
        "{}",
        competitor.client
    );
    assert_eq!(competitor.steps.len(), 2);
    for s in &competitor.steps {
        let put = &s.ops["put"];
        assert!(put.ops > 0 && put.errors == 0, "{} {put:?}", s.label());
        let e2e = put.phase(Phase::E2e).unwrap();
        assert!(e2e.p50 > 0.0 && e2e.p99 >= e2e.p50);
        assert!(s.generator_cpu_utilisation > 0.0);
    }
    let a = r.analysis.as_ref().unwrap();
    let rows: Vec<_> = a
        .comparison
        .iter()
        .filter(|c| c.competitor == competitor.name)
        .collect();
    assert_eq!(rows.len(), 2, "{:?}", a.comparison);
    assert!(
        rows.iter()
            .all(|c| c.op == "write" && c.competitor_op == "put")
    );
    // Mooncake's sockets were seen too (by its processes' ids).
    let net = r.network.as_ref().unwrap();
    assert!(
        !net.observed_cc
            .get(&competitor.name)
            .cloned()
            .unwrap_or_default()
            .is_empty(),
        "{net:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
