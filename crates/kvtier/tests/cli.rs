//! The real `kvtier` binary: serve + CLI verbs, config handling, graceful shutdown.
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::BIN;

struct Served {
    child: Child,
    grpc: String,
}

impl Served {
    fn start(extra: &[&str]) -> Self {
        Self::start_with_stderr(extra, Stdio::null())
    }

    /// `serve` on ephemeral loopback ports, its stderr sent to `stderr`.
    fn start_with_stderr(extra: &[&str], stderr: Stdio) -> Self {
        let mut child = common::serve_command()
            .args(extra)
            .env_remove("RUST_LOG")
            .stderr(stderr)
            .spawn()
            .expect("spawn kvtier serve");
        // Readiness: the server prints its bound addresses once listening.
        let v = common::ready(&mut child).expect("ready json");
        Self {
            child,
            grpc: format!("http://{}", v["grpc"][0].as_str().unwrap()),
        }
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .args(["--server", &self.grpc])
            .output()
            .expect("run cli")
    }

    /// SIGTERM and wait (bounded) for a clean exit.
    fn stop(mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

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

/// Starts `serve` with stderr captured to a file; returns the server and the file.
fn serve_logged(extra: &[&str]) -> (Served, tempfile::TempPath) {
    let log = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let err = std::fs::File::create(&log).unwrap();
    (Served::start_with_stderr(extra, err.into()), log)
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

/// With no server, the CLI says so once, with a hint, and no backtrace.
#[test]
fn cli_without_a_server_explains_and_suggests_starting_one() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(BIN)
        .args(["stats", "--server", &format!("http://127.0.0.1:{port}")])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(err.contains("Connection refused"), "{err}");
    assert!(
        err.contains("hint: no kvtier server answers") && err.contains("kvtier serve"),
        "{err}"
    );
    assert!(
        !err.contains("backtrace") && !err.contains("transport error"),
        "{err}"
    );
}

/// Too few tokens for one block: the message says how many a block needs.
#[test]
fn lookup_with_less_than_a_block_says_the_block_size() {
    let out = Command::new(BIN)
        .args([
            "lookup",
            "--tokens",
            "1,2,3",
            "--server",
            "http://127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("3 token(s) do not fill one block of 128 tokens"),
        "{err}"
    );
}

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

/// The gRPC client pointed at the HTTP port: a hint about the port and TLS.
#[test]
fn wrong_port_gets_a_port_and_tls_hint() {
    let mut child = common::serve_command()
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let v = common::ready(&mut child).expect("ready json");
    let http = format!("http://{}", v["http"].as_str().unwrap());
    let out = Command::new(BIN)
        .args(["stats", "--server", &http, "--timeout-ms", "3000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot connect to {http}")), "{err}");
    assert!(
        err.contains("is this the gRPC port") && err.contains("--tls-ca"),
        "{err}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
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

/// `kvtier demo` takes KVTIER_SERVER like the other verbs and names the
/// address it cannot reach; `kvtier bench`'s hint names --target.
#[test]
fn demo_honours_kvtier_server_and_bench_hints_target() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("http://127.0.0.1:{port}");
    let out = Command::new(BIN)
        .args(["demo", "--out"])
        .arg(dir.path())
        .env("KVTIER_SERVER", &addr)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot connect to {addr}")), "{err}");
    let out = Command::new(BIN)
        .args(["bench", "--target", &format!("grpc://127.0.0.1:{port}")])
        .args([
            "--workload",
            "read",
            "--duration",
            "100ms",
            "--warmup",
            "0ms",
        ])
        .args(["--retries", "0", "--quiet", "--out"])
        .arg(dir.path().join("bench"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Connection refused"), "{err}");
    assert!(
        err.contains("--target URL") && !err.contains("--server"),
        "{err}"
    );
}

/// A --key that is not hex says which character, or that the length is odd.
#[test]
fn non_hex_keys_say_what_is_wrong() {
    let err = |key: &str| {
        let out = Command::new(BIN)
            .args(["get", "--server", "http://127.0.0.1:1", "--key", key])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = err("xyz");
    assert!(e.contains("is not hex: 'x' at position 1"), "{e}");
    let e = err("0a1g");
    assert!(e.contains("'g' at position 4"), "{e}");
    let e = err("abc");
    assert!(e.contains("odd number of hex digits (3)"), "{e}");
}

/// A CA and a server certificate for 127.0.0.1, as PEM files in `dir`.
fn test_pki(dir: &std::path::Path) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

#[test]
fn serve_and_the_cli_speak_tls() {
    let dir = tempfile::tempdir().unwrap();
    test_pki(dir.path());
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let s = Served::start(&[
        "--tls-cert",
        &p("server.pem"),
        "--tls-key",
        &p("server.key"),
    ]);
    let run = |args: &[&str], ca: Option<&str>| {
        let mut c = Command::new(BIN);
        c.args(args)
            .args(["--server", &s.grpc, "--timeout-ms", "3000"])
            .env_remove("KVTIER_TLS_CA");
        if let Some(ca) = ca {
            c.env("KVTIER_TLS_CA", ca);
        }
        c.output().unwrap()
    };
    let health = run(&["health"], Some(&p("ca.pem")));
    assert!(
        health.status.success(),
        "{}",
        String::from_utf8_lossy(&health.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&health.stdout).trim(), "SERVING");
    let plain = run(&["health"], None);
    assert!(!plain.status.success(), "plaintext refused");
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(
        err.contains("does the server use TLS (https:// and --tls-ca)?"),
        "{err}"
    );
    // https:// without a CA: refused with the flag to give, not tonic's
    // "Connecting to HTTPS without TLS enabled".
    let https = s.grpc.replace("http://", "https://");
    let out = Command::new(BIN)
        .args(["stats", "--server", &https])
        .env_remove("KVTIER_TLS_CA")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("https:// needs --tls-ca FILE (or KVTIER_TLS_CA)"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["stats", "--server", &https, "--tls-ca", &p("ca.pem")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.path().join("value");
    std::fs::write(&file, b"over tls").unwrap();
    let put = run(
        &[
            "put",
            "-n",
            "t",
            "--text-key",
            "k",
            "--file",
            file.to_str().unwrap(),
        ],
        Some(&p("ca.pem")),
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = run(&["get", "-n", "t", "--text-key", "k"], Some(&p("ca.pem")));
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert_eq!(get.stdout, b"over tls");
    // `kvtier bench` takes TLS from the same variables, on both transports.
    let target = s.grpc.replace("http://", "grpc://");
    let bench = |transport: &str, ca: Option<&str>| {
        let out = dir
            .path()
            .join(format!("bench-{transport}-{}", ca.is_some()));
        let mut c = Command::new(BIN);
        c.args(["bench", "--target", &target, "--workload", "read"])
            .args(["--transport", transport, "--value-size", "65536"])
            .args([
                "--concurrency",
                "1",
                "--duration",
                "300ms",
                "--warmup",
                "100ms",
            ])
            .args(["--retries", "0", "--quiet", "--out"])
            .arg(&out)
            .env_remove("KVTIER_TLS_CA");
        if let Some(ca) = ca {
            c.env("KVTIER_TLS_CA", ca);
        }
        let done = c.output().unwrap();
        let record = std::fs::read_to_string(out.join("record.json")).ok();
        (done, record)
    };
    for transport in ["grpc", "data-plane"] {
        let (done, record) = bench(transport, Some(&p("ca.pem")));
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(&record.expect("record.json")).unwrap();
        let o = &v["steps"][0]["ops"]["read"];
        assert!(o["ops"].as_u64().unwrap() > 0, "{transport}: {o}");
        assert_eq!(o["errors"].as_u64(), Some(0), "{transport}: {o}");
        let (plain, _) = bench(transport, None);
        assert!(
            !plain.status.success(),
            "{transport}: bench without TLS against a TLS server succeeded"
        );
    }
    assert!(s.stop().success());
}
