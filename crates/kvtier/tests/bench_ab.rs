//! `kvtier bench ab` end to end. Building a revision is a release build of
//! the workspace (minutes on CI's 2 cores), so the measurement is tested with
//! this test binary as both sides (`--base-bin`, `--head-bin`) and the build
//! path through its cache: a binary already in the cache for HEAD's commit is
//! used and nothing is built (docs/bench.md, "A/B of two revisions").
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod bench_common;
mod common;

use bench_common::tmp;
use common::BIN;

/// The workload of every test here: one short step of 4 KB reads.
const TINY: [&str; 10] = [
    "--workload",
    "read",
    "--concurrency",
    "1",
    "--duration",
    "200ms",
    "--warmup",
    "50ms",
    "--value-size",
    "4KB",
];

fn ab(args: &[&str], out: &Path) -> Output {
    Command::new(BIN)
        .args(["bench", "ab"])
        .args(args)
        .args(TINY)
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run kvtier bench ab")
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "kvtier bench ab failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn record(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("record.json")).unwrap()).unwrap()
}

fn head_commit() -> String {
    let o = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .expect("git");
    assert!(o.status.success(), "these tests run inside the checkout");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn a_variant_on_one_binary_gives_both_sides_a_ratio_and_the_header() {
    let out = tmp("ab-variant");
    let o = ab(
        &[
            "--base",
            "HEAD",
            "--head",
            "HEAD",
            "--base-bin",
            BIN,
            "--head-bin",
            BIN,
            "--variant",
            "server.max_inflight=512",
            "--variant",
            "bench.transport=grpc",
            "--repeats",
            "2",
        ],
        &out,
    );
    ok(&o);
    let r = record(&out);
    // The header comes first, in its order (the top-level keys of the
    // pretty-printed file, in the order written).
    let text = std::fs::read_to_string(out.join("record.json")).unwrap();
    let keys: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("  \"")?.split_once('"').map(|(k, _)| k))
        .collect();
    assert_eq!(
        keys[..7],
        [
            "date", "commit", "dirty", "machine", "command", "versions", "kind"
        ],
        "{text}"
    );
    assert_eq!(r["commit"].as_str().unwrap(), head_commit());
    assert!(
        r["command"]
            .as_str()
            .unwrap()
            .contains("--variant server.max_inflight=512")
    );
    assert!(r["versions"]["kvtier (head)"].is_string());
    assert_eq!(
        r["order"],
        serde_json::json!(["base", "head", "head", "base"])
    );
    // The variant reached the head's server and generator only.
    let (base, head) = (&r["base"], &r["head"]);
    assert!(
        head["server_config"]
            .as_str()
            .unwrap()
            .contains("max_inflight = 512")
    );
    assert!(
        !base["server_config"]
            .as_str()
            .unwrap()
            .contains("max_inflight = 512")
    );
    let api = |side: &serde_json::Value| -> Vec<String> {
        side["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                record(out.join(p.as_str().unwrap()).parent().unwrap())["api"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(api(head), ["v1+grpc", "v1+grpc"]);
    assert_eq!(api(base), ["v1+wire", "v1+wire"], "auto: the data plane");
    // Every metric has both sides' repeats, a median and a ratio.
    let metrics = r["metrics"].as_array().unwrap();
    let names: Vec<&str> = metrics
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    for want in ["c=1 read ops/s", "c=1 read p99 µs", "server peak RSS MiB"] {
        assert!(names.contains(&want), "{names:?}");
    }
    for m in metrics {
        for side in ["base", "head"] {
            assert_eq!(m[side]["repeats"].as_array().unwrap().len(), 2, "{m}");
            assert!(m[side]["min"].as_f64() <= m[side]["median"].as_f64(), "{m}");
        }
        let ratio = m["ratio"].as_f64().unwrap();
        let want = m["head"]["median"].as_f64().unwrap() / m["base"]["median"].as_f64().unwrap();
        assert!(ratio > 0.0 && (ratio - want).abs() < 1e-9, "{m}");
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("| c=1 read ops/s (higher is better) |"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_cached_revision_is_not_rebuilt() {
    let out = tmp("ab-cache");
    let cache = tmp("ab-cache-dir");
    let commit = head_commit();
    let cached: PathBuf = cache.join(&commit).join("kvtier");
    std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
    std::fs::copy(BIN, &cached).unwrap();
    let before = std::fs::metadata(&cached).unwrap().modified().unwrap();
    for _ in 0..2 {
        let o = ab(
            &[
                "--base",
                "HEAD",
                "--head",
                &commit,
                "--repeats",
                "1",
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
            &out,
        );
        ok(&o);
        let r = record(&out);
        for side in ["base", "head"] {
            assert_eq!(r[side]["binary"]["how"], "cached", "{}", r[side]);
            assert_eq!(r[side]["binary"]["commit"].as_str().unwrap(), commit);
            assert_eq!(
                Path::new(r[side]["binary"]["path"].as_str().unwrap()),
                std::path::absolute(&cached).unwrap()
            );
        }
        assert!(String::from_utf8_lossy(&o.stderr).contains("cached"));
    }
    assert_eq!(
        std::fs::metadata(&cached).unwrap().modified().unwrap(),
        before
    );
    assert!(
        !cache.join(&commit).join("tree").exists(),
        "no worktree made"
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn bad_revisions_keys_and_options_are_refused_before_anything_runs() {
    let out = tmp("ab-refused");
    let cases: [(&[&str], &str); 4] = [
        (&["--base", "no-such-revision-x"], "is not a commit"),
        (
            &[
                "--base-bin",
                BIN,
                "--head-bin",
                BIN,
                "--variant",
                "server.no_such_key=1",
            ],
            "no_such_key",
        ),
        (
            &[
                "--base-bin",
                BIN,
                "--head-bin",
                BIN,
                "--variant",
                "bench.no-such=1",
            ],
            "not a `kvtier bench` workload option",
        ),
        (
            &[
                "--base-bin",
                BIN,
                "--head-bin",
                BIN,
                "--target",
                "grpc://127.0.0.1:1",
            ],
            "no --target",
        ),
    ];
    for (args, want) in cases {
        let o = ab(args, &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
        assert!(!out.join("record.json").exists());
    }
    let _ = std::fs::remove_dir_all(&out);
}
