//! What the real binary refuses with a disk tier (docs/durability.md): a
//! write that does not fit a full tier is RESOURCE_EXHAUSTED while reads of
//! what is stored continue, and a `--disk-dir` it cannot use, or that
//! another server holds, stops it at start, naming the path.
mod common;

use common::BIN;
use common::disk::{NS, chain, key, payload_for, runtime, start, try_start};
use kvtier_core::Key;
use std::process::Command;
use std::time::{Duration, Instant};

/// A tier smaller than the data: writes that cannot fit fail with
/// RESOURCE_EXHAUSTED under `always` and reads of what is stored continue.
///
/// A real ENOSPC (on a tmpfs the test mounts) is
/// `enospc_is_resource_exhausted_and_reads_continue` in
/// `kvtier-core/tests/disk_errors.rs`; both paths share the same error mapping.
#[test]
fn full_disk_tier_refuses_writes_and_keeps_serving_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    // 1 MiB of disk: four or five 64–256 KiB blocks of one chain. Only leaves
    // that are not the new block's parent can be evicted, so a chain longer
    // than the tier cannot be stored.
    let args = [
        "--disk-sync",
        "always",
        "--disk-capacity",
        "1MiB",
        "--max-block-size",
        "256KiB",
        "--memory-capacity",
        "64MiB",
    ];
    let s = start(&dir, &log, &args);
    let keys: Vec<Key> = (0..12).map(|i| key(&[3, i])).collect();
    let blocks = chain(&keys);
    let rt = runtime();
    let stored = rt.block_on(async {
        let c = s.client().await;
        let mut stored = 0;
        for b in &blocks {
            match c.write(NS, std::slice::from_ref(b)).await {
                Ok(_) => stored += 1,
                Err(e) => {
                    assert_eq!(
                        e.code().map(|c| c as i32),
                        Some(8),
                        "RESOURCE_EXHAUSTED: {e}"
                    );
                    assert!(e.to_string().contains("full"), "{e}");
                    break;
                }
            }
        }
        assert!((2..keys.len()).contains(&stored), "stored {stored}");
        // Under `always` a refused write is not kept in memory either.
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert_eq!(
            l.found, stored,
            "exactly the acknowledged prefix is present"
        );
        // The server keeps serving reads of what it has.
        let r = c.read(NS, &keys[..stored], 0).await.unwrap();
        assert_eq!(r.blocks.len(), stored);
        for (b, k) in r.blocks.iter().zip(&keys) {
            assert!(b.payload == payload_for(k.as_bytes()));
        }
        // Independent blocks still fit by evicting other leaves: not an error.
        c.write(NS, &chain(&[key(&[4, 0])])).await.unwrap();
        stored
    });
    assert!(s.metric("kvtier_disk_write_exhausted_total") >= 1.0);
    assert!(s.metric("kvtier_disk_write_errors_total") == 0.0);
    s.stop();
    eprintln!(
        "full tier: {stored} of {} chain blocks stored, then RESOURCE_EXHAUSTED",
        keys.len()
    );
}

/// An unusable `--disk-dir` stops the process at start, quickly, naming the path.
#[test]
fn unusable_disk_dir_exits_nonzero_naming_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("regular-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("disk");
    let t0 = Instant::now();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "",
            "--ready-json",
            "--disk-dir",
        ])
        .arg(&bad)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "never reported ready");
    assert!(
        stderr.contains(bad.to_str().unwrap()),
        "stderr names the path: {stderr}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    // A directory held by another server is refused the same way.
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("a.log");
    let a = start(&dir, &log, &[]);
    let b = try_start(&dir, &tmp.path().join("b.log"), &[]);
    let (st, stderr) = b.err().expect("second server on the same dir must fail");
    assert!(!st.success());
    assert!(
        stderr.contains(dir.to_str().unwrap()) && stderr.contains("in use"),
        "{stderr}"
    );
    a.stop();
}
