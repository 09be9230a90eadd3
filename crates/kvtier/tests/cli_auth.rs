//! Tokens through the real binary (docs/operations.md): with
//! `--auth-tokens` the CLI needs `--token` / KVTIER_TOKEN, SIGHUP swaps the
//! tokens without a restart (and says so when authentication is off), and a
//! refused token is blamed on the token, naming the flag.
mod common;

use common::BIN;
use common::cli::{Served, serve_logged};
use std::process::Command;
use std::time::{Duration, Instant};

/// `--auth-tokens`: the CLI needs `--token` (or KVTIER_TOKEN); SIGHUP swaps
/// the tokens without a restart (the old one stops working, the new one works).
#[test]
fn tokens_are_required_and_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let tokens = |t: &str| {
        format!("[[tokens]]\ntoken = \"{t}\"\nnamespaces = [\"\"]\naccess = \"read-write\"\n")
    };
    std::fs::write(&file, tokens("first-token-1234567890")).unwrap();
    let s = Served::start(&["--auth-tokens", file.to_str().unwrap()]);
    let stats = |token: Option<&str>| {
        let mut c = Command::new(BIN);
        c.args(["stats", "--server", &s.grpc])
            .env_remove("KVTIER_TOKEN");
        if let Some(t) = token {
            c.env("KVTIER_TOKEN", t);
        }
        c.output().unwrap()
    };
    let out = stats(None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("requires a token"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stats(Some("first-token-1234567890")).status.success());
    std::fs::write(&file, tokens("second-token-1234567890")).unwrap();
    Command::new("kill")
        .args(["-HUP", &s.child.id().to_string()])
        .status()
        .unwrap();
    // The reload is asynchronous: probe until the new token works.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stats(Some("second-token-1234567890")).status.success() {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the tokens"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !stats(Some("first-token-1234567890")).status.success(),
        "revoked"
    );
    assert!(s.stop().success());
}

/// SIGHUP with authentication off says so instead of "0 tokens reloaded".
#[test]
fn sighup_without_auth_says_authentication_is_off() {
    let (s, log) = serve_logged(&[]);
    Command::new("kill")
        .args(["-HUP", &s.child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("SIGHUP") {
            break text;
        }
        assert!(Instant::now() < deadline, "no SIGHUP line: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(text.contains("authentication is off"), "{text}");
    assert!(!text.contains("tokens reloaded"), "{text}");
    assert!(s.stop().success());
}

/// A refused token is blamed on the token, not the connection, and names
/// --token / KVTIER_TOKEN; a status's message is printed once.
#[test]
fn token_errors_name_the_flag_and_a_status_prints_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    std::fs::write(
        &file,
        "[[tokens]]\ntoken = \"acme-reader-1234567890\"\nnamespaces = [\"acme/\"]\naccess = \"read\"\n",
    )
    .unwrap();
    let s = Served::start(&["--auth-tokens", file.to_str().unwrap()]);
    let value = dir.path().join("v");
    std::fs::write(&value, b"x").unwrap();
    let run = |token: &str, ns: &str| {
        let mut c = Command::new(BIN);
        if ns.len() > 128 {
            c.arg("get");
        } else {
            c.arg("put").arg("--file").arg(&value);
        }
        let out = c
            .args(["--server", &s.grpc, "-n", ns, "--text-key", "k"])
            .env("KVTIER_TOKEN", token)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("wrong-token-1234567890", "acme/a");
    assert!(
        err.contains("authentication failed: unknown token"),
        "{err}"
    );
    assert!(
        err.contains("--token") && err.contains("KVTIER_TOKEN"),
        "{err}"
    );
    assert!(!err.contains("cannot connect"), "{err}");
    assert_eq!(err.matches("unknown token").count(), 1, "{err}");
    let err = run("acme-reader-1234567890", "acme/a");
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("--token"), "{err}");
    // (a read of a namespace the token covers, refused as INVALID_ARGUMENT)
    let long = format!("acme/{}", "x".repeat(295));
    let err = run("acme-reader-1234567890", &long);
    assert_eq!(err.matches("is 300 bytes").count(), 1, "{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(s.stop().success());
}
