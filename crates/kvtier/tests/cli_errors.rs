//! CLI errors say what is wrong and the way out, once and without a
//! backtrace: no server at the address, the HTTP port given for gRPC, too
//! few tokens for a block, a key that is not hex, and `demo` / `bench`
//! naming the address (or flag) they could not reach.
mod common;

use common::BIN;
use std::process::{Command, Stdio};

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
