//! A same-host client talks only to a listener that runs as the server it
//! means (docs/security.md, "Threats and their guards"): a socket bound by
//! another uid (nobody, here) is refused before anything is sent, so the
//! bearer token never reaches it. Runs as root (it starts the impostor as
//! uid 65534); elsewhere it fails under CI=true and is skipped otherwise.
use kvtier_client::wire::WireClient;
use kvtier_client::{Client, ClientConfig};
use std::io::{BufRead, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

const NOBODY: u32 = 65534;
const TOKEN: &str = "secret-token-for-the-real-server";

/// The impostor: binds `path` as uid nobody, then records every byte any
/// client sends until 2 s pass with no new connection; prints them as hex.
const IMPOSTOR: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o666); s.listen(16)
print("ready", flush=True)
s.settimeout(2)
got = b""
while True:
    try:
        c, _ = s.accept()
    except OSError:
        break
    c.settimeout(0.5)
    try:
        while (d := c.recv(65536)):
            got += d
    except OSError:
        pass
print(got.hex(), flush=True)
"#;

#[tokio::test]
async fn a_socket_bound_by_another_uid_never_gets_the_token() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("CI").is_err(),
            "this test needs root (CI=true)"
        );
        eprintln!("skipped: needs root to start a listener as another uid");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kvtier-impostor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.join("kvtier.sock");
    let mut child = std::process::Command::new("python3")
        .arg("-c")
        .arg(IMPOSTOR)
        .arg(&path)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let p = path.to_string_lossy().to_string();

    // The data plane (Hello carries the token): refused, naming the uid.
    let Err(e) = WireClient::connect_local(
        &p,
        2,
        Duration::from_secs(2),
        Duration::from_secs(2),
        Some(TOKEN),
        None,
    )
    .await
    else {
        panic!("an impostor's socket is refused");
    };
    assert!(e.to_string().contains("runs as uid 65534"), "{e}");
    // The full client (gRPC first): refused too.
    let mut cc = ClientConfig::new(format!("unix://{p}"));
    cc.token = Some(TOKEN.into());
    cc.connect_timeout = Duration::from_secs(2);
    let Err(e) = Client::connect(cc).await else {
        panic!("an impostor's socket is refused");
    };
    assert!(e.to_string().contains("runs as uid 65534"), "{e}");
    // Told to expect that uid, the client does connect to it.
    let r = WireClient::connect_local(
        &p,
        1,
        Duration::from_millis(300),
        Duration::from_millis(300),
        None,
        Some(NOBODY),
    )
    .await;
    assert!(r.is_ok(), "{:?}", r.err());
    drop(r);

    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let token_hex: String = TOKEN.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(
        !rest.contains(&token_hex),
        "the token reached a socket another uid listens on"
    );
}
