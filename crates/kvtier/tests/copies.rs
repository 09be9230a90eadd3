//! Payload copies measured as copies: the server runs with an LD_PRELOAD
//! interposer (`tests/tools/memcount.c`) that counts every user-space
//! memcpy / memmove of ≥ 64 KiB, under a load of 1.2 MB reads or writes
//! from `kvtier bench`. Over the data plane the server copies no payload in
//! user space, either way (the kernel's socket copy is its only one); the
//! gRPC path is the positive control that shows the counter sees copies.
use std::path::Path;
use std::process::{Command, Stdio};

mod common;

use common::BIN;
const SIZE: u64 = 1_258_291;

struct Counted {
    reads: u64,
    writes: u64,
    bytes_copied: u64,
}

/// Runs `kvtier bench --workload WORKLOAD --transport T` against a server
/// under the interposer; returns what the server served and copied.
fn run(dir: &Path, so: &Path, workload: &str, transport: &str) -> Counted {
    let out = dir.join(format!("{workload}-{transport}.json"));
    let mut server = common::serve_command()
        .env("LD_PRELOAD", so)
        .env("MEMCOUNT_OUT", &out)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("spawn kvtier serve");
    let ready = common::ready(&mut server).expect("ready json");
    let grpc = format!("grpc://{}", ready["grpc"][0].as_str().unwrap());
    let http = ready["http"].as_str().unwrap().to_string();
    let st = Command::new(BIN)
        .args(["bench", "--target", &grpc, "--workload", workload])
        .args(["--transport", transport, "--value-size", &SIZE.to_string()])
        .args([
            "--concurrency",
            "2",
            "--duration",
            "500ms",
            "--warmup",
            "100ms",
        ])
        .arg("--quiet")
        .arg("--out")
        .arg(dir.join(format!("bench-{workload}-{transport}")))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let (reads, writes) = (
        common::requests_total(&http, "read"),
        common::requests_total(&http, "write"),
    );
    // SIGTERM: a clean exit runs the interposer's destructor.
    assert!(
        Command::new("kill")
            .arg(server.id().to_string())
            .status()
            .unwrap()
            .success()
    );
    assert!(server.wait().unwrap().success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("interposer output")).unwrap();
    Counted {
        reads,
        writes,
        bytes_copied: v["bytes"].as_u64().unwrap(),
    }
}

#[test]
fn the_data_plane_copies_no_payload_in_user_space() {
    let dir = tempfile::tempdir().unwrap();
    let so = common::interposer("memcount", dir.path());
    // Positive control: gRPC writes copy their payload (decode, then into the tier).
    let g = run(dir.path(), &so, "write", "grpc");
    assert!(g.writes > 10, "{} writes", g.writes);
    let per_write = g.bytes_copied as f64 / (g.writes * SIZE) as f64;
    assert!(
        per_write >= 0.9,
        "the counter must see gRPC's payload copies: {per_write:.2} per write"
    );
    // The data plane: writes land in their final buffer, reads go out from the stored bytes.
    let w = run(dir.path(), &so, "write", "data-plane");
    assert!(w.writes > 10);
    assert!(
        w.bytes_copied < w.writes * SIZE / 100,
        "{} bytes copied for {} data-plane writes",
        w.bytes_copied,
        w.writes
    );
    let r = run(dir.path(), &so, "read", "data-plane");
    assert!(r.reads > 10);
    assert!(
        r.bytes_copied < (r.reads + r.writes) * SIZE / 100,
        "{} bytes copied for {} data-plane reads ({} preload writes)",
        r.bytes_copied,
        r.reads,
        r.writes
    );
}
