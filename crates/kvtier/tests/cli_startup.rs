//! How `kvtier serve` starts: a config file and flags (`--print-config`
//! prints a config that reads back the same, unknown keys and bad sizes are
//! refused), the start-up log naming listeners and tiers without colour
//! codes, and the refusals and warnings an operator needs before serving
//! (beyond loopback without tokens, a disk budget beyond free space).
mod common;

use common::BIN;
use common::cli::serve_logged;
use std::process::Command;

#[test]
fn config_file_flags_and_print_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kvtier.toml");
    std::fs::write(&cfg, "[engine]\nmemory_capacity = \"512MiB\"\n").unwrap();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--config",
            cfg.to_str().unwrap(),
            "--max-block-size",
            "8MiB",
            "--print-config",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("memory_capacity = \"512MiB\""), "{text}");
    assert!(text.contains("max_block_size = \"8MiB\""), "{text}");
    // The printed config is itself a valid config.
    std::fs::write(&cfg, &text).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap(), "--print-config"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    // Unknown keys are rejected with a message naming them.
    std::fs::write(&cfg, "[engine]\nmemory_capacty = \"1GiB\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory_capacty"));
    // Bad sizes too.
    let out = Command::new(BIN)
        .args(["serve", "--memory-capacity", "lots", "--print-config"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// Start-up says what listens where and which tiers are on, in plain text
/// (no colour codes when stderr is a file or pipe).
#[test]
fn start_up_log_names_listeners_and_tiers_without_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let (served, log) = serve_logged(&[
        "--disk-dir",
        disk.to_str().unwrap(),
        "--disk-capacity",
        "64MiB",
    ]);
    let grpc = served.grpc.trim_start_matches("http://").to_string();
    assert!(served.stop().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escape codes in a log file:\n{text}"
    );
    assert!(text.contains(&format!("gRPC {grpc}")), "{text}");
    assert!(text.contains("data plane 127.0.0.1:"), "{text}");
    assert!(
        text.contains(&format!(
            "tiers: memory 2GiB -> disk 64MiB at {}",
            disk.display()
        )),
        "{text}"
    );
    assert!(text.contains("no object store"), "{text}");
    assert!(
        !text.contains("more than the disk tier can get"),
        "64 MiB fits: {text}"
    );
}

/// Beyond loopback without tokens: refused with the way out named, or, with
/// `--insecure`, started with a loud warning.
#[test]
fn beyond_loopback_without_auth_is_refused_or_loudly_insecure() {
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without auth: {text}");
    assert!(text.contains("refusing to listen on 0.0.0.0"), "{text}");
    assert!(
        text.contains("--auth-tokens") && text.contains("--insecure"),
        "{text}"
    );

    let (served, log) = serve_logged(&["--listen", "0.0.0.0:0", "--insecure"]);
    assert!(served.stop().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("WARN")
            && text.contains("INSECURE: listening on")
            && text.contains("0.0.0.0"),
        "{text}"
    );
}

/// A disk budget larger than the filesystem's free space is called out.
#[test]
fn disk_capacity_beyond_free_space_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let (served, log) = serve_logged(&[
        "--disk-dir",
        dir.path().to_str().unwrap(),
        "--disk-capacity",
        "4096TiB",
    ]);
    assert!(served.stop().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("disk.capacity 4096TiB is more than the disk tier can get"),
        "{text}"
    );
}
