//! `kvtier bench compare A B` on perf records of any kind: conditions (the
//! header) first, then the numbers with B / A; the records under notes/; a
//! record without the header refused with what to do about it.
use std::path::Path;
use std::process::{Command, Output};

mod bench_common;
mod common;

use bench_common::tmp;
use common::BIN;

fn compare(a: &Path, b: &Path) -> Output {
    Command::new(BIN)
        .args(["bench", "compare"])
        .arg(a)
        .arg(b)
        .output()
        .expect("run kvtier bench compare")
}

fn rec(commit: &str, kernel: &str, kvtier: &str, ops: f64) -> serde_json::Value {
    serde_json::json!({
        "date": "2026-11-27T08:00:00+00:00", "commit": commit, "dirty": false,
        "machine": {"cpu_model": "x", "cores": 2, "kernel": kernel},
        "command": "scripts/x.py", "versions": {"kvtier": kvtier},
        "rows": [{"step": "c=1", "ops_s": ops, "p99_us": 900.0}, {"step": "c=8", "ops_s": 40.0}],
    })
}

#[test]
fn conditions_come_first_then_the_numbers_with_ratios() {
    let d = tmp("compare");
    std::fs::create_dir_all(&d).unwrap();
    let (a, b) = (d.join("a.json"), d.join("b.json"));
    std::fs::write(&a, rec("aaaaaaa", "6.1", "0.1.0", 100.0).to_string()).unwrap();
    std::fs::write(&b, rec("bbbbbbb", "6.8", "0.2.0", 150.0).to_string()).unwrap();
    let o = compare(&a, &b);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (cond, nums) = (
        text.find("## Conditions").unwrap(),
        text.find("## Numbers").unwrap(),
    );
    assert!(cond < nums, "{text}");
    for want in [
        "| commit | aaaaaaa | bbbbbbb |",
        "| machine.kernel | 6.1 | 6.8 |",
        "| versions.kvtier | 0.1.0 | 0.2.0 |",
    ] {
        let at = text.find(want).unwrap_or_else(|| panic!("{want}: {text}"));
        assert!(at < nums, "{want} is a condition: {text}");
    }
    assert!(
        text.contains("| rows[step=c=1].ops_s | 100 | 150 | 1.500 |"),
        "{text}"
    );
    assert!(
        !text.contains("p99_us |"),
        "equal numbers are not listed: {text}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_records_under_notes_compare() {
    let notes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../notes");
    let o = compare(
        &notes.join("019-refactor-ab.json"),
        &notes.join("041-reply-watchdog.json"),
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("| commit | a971f70"), "{text}");
    assert!(
        text.contains("| data_plane[step=read c=1].head_ops_s[0] |"),
        "{text}"
    );
}

#[test]
fn a_record_without_the_header_is_refused() {
    let d = tmp("compare-no-header");
    std::fs::create_dir_all(&d).unwrap();
    let (a, b) = (d.join("old.json"), d.join("b.json"));
    std::fs::write(&a, r#"{"git_commit": "abc", "rows": [1]}"#).unwrap();
    std::fs::write(&b, rec("bbbbbbb", "6.8", "0.2.0", 150.0).to_string()).unwrap();
    let o = compare(&a, &b);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("old.json has no perf record header (no 'date'; no 'commit'"),
        "{err}"
    );
    assert!(err.contains("python3 -m perf.stamp"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
