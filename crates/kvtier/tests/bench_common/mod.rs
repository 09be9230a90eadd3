//! Helpers of the `kvtier bench` tests (bench.rs, bench_peers.rs,
//! bench_ab.rs, bench_compare.rs): run a sweep and read its record, a
//! scratch directory, and the checks every plausible sweep passes.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::Command;

use kvtier_bench::record::{Phase, Record};

use crate::common::BIN;

pub fn bench(out: &Path, args: &[&str]) -> Record {
    let o = Command::new(BIN)
        .arg("bench")
        .args(args)
        .args(["--quiet", "--out"])
        .arg(out)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run kvtier bench");
    assert!(
        o.status.success(),
        "kvtier bench {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for f in ["record.json", "summary.md", "report.html"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    Record::from_json(&std::fs::read_to_string(out.join("record.json")).unwrap()).unwrap()
}

pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvtier-bench-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Every step has traffic, positive latencies, network time, and Little's law roughly holds.
pub fn plausible(r: &Record, ops: &[&str]) {
    assert!(!r.steps.is_empty());
    for s in &r.steps {
        for op in ops {
            let o = s
                .ops
                .get(*op)
                .unwrap_or_else(|| panic!("{} has no {op}", s.label()));
            assert!(
                o.ops > 0 && o.errors == 0,
                "{} {op}: {} ops, {} errors",
                s.label(),
                o.ops,
                o.errors
            );
            let e2e = o.phase(Phase::E2e).unwrap();
            assert!(e2e.p50 > 0.0 && e2e.p99 >= e2e.p50, "{e2e:?}");
            assert!(
                o.phase(Phase::Network).is_some(),
                "{} {op}: no network phase",
                s.label()
            );
            assert!(o.phase(Phase::ServerService).is_some());
        }
    }
    let a = r.analysis.as_ref().expect("analysis");
    for l in &a.littles_law {
        let ratio = l.ratio.expect("ratio");
        assert!((0.5..1.5).contains(&ratio), "Little's law far off: {l:?}");
    }
}
