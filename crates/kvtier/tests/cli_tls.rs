//! TLS through the real binary: `serve --tls-cert/--tls-key` and the CLI
//! and `kvtier bench` (both transports) with a CA from `--tls-ca` or
//! KVTIER_TLS_CA; plaintext and `https://` without a CA are refused with the
//! flag to give.
mod common;

use common::BIN;
use common::cli::Served;
use std::process::Command;

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
