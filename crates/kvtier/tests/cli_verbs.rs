//! The CLI's verbs against a real `kvtier serve`: put, get, lookup, delete
//! and stats round-trip a block byte-identical, and a CLI whose stdout is
//! closed (`kvtier stats | head -1`) exits quietly; the server stops cleanly
//! on SIGTERM.
mod common;

use common::BIN;
use common::cli::Served;
use std::process::{Command, Stdio};

#[test]
fn put_get_lookup_delete_through_the_cli() {
    let s = Served::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("block.bin");
    let payload: Vec<u8> = (0..1_200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &payload).unwrap();
    let out = s.cli(&[
        "put",
        "-n",
        "cli",
        "--key",
        "00112233aabbccdd",
        "-f",
        src.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dst = dir.path().join("back.bin");
    let out = s.cli(&[
        "get",
        "-n",
        "cli",
        "--key",
        "00112233aabbccdd",
        "-o",
        dst.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&dst).unwrap(),
        payload,
        "byte-identical through the CLI"
    );
    let out = s.cli(&["lookup", "-n", "cli", "--keys", "00112233aabbccdd,ffff"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["found"], 1);
    assert_eq!(v["tiers"][0], "TIER_MEMORY");
    let out = s.cli(&["delete", "-n", "cli", "--key", "00112233aabbccdd"]);
    assert!(out.status.success());
    let out = s.cli(&["get", "-n", "cli", "--key", "00112233aabbccdd"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let out = s.cli(&["stats"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tiers"][0]["blocks"], 0);
    let out = s.cli(&["lookup", "--tokens", "1,2,3"]);
    assert!(
        !out.status.success(),
        "fewer tokens than a block is a clear error"
    );
    assert!(s.stop().success(), "graceful exit on SIGTERM");
}

/// `kvtier stats | head -1`: the reader is gone when the CLI prints; it
/// exits 141 without a panic.
#[test]
fn closed_stdout_exits_quietly() {
    let s = Served::start(&[]);
    let mut child = Command::new(BIN)
        .args(["stats", "--server", &s.grpc])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked") && err.is_empty(), "{err}");
    assert!(s.stop().success());
}
