//! Connection floods do not take the server's health down
//! (docs/operations.md, "Connection floods"): 5,000 idle TCP connections to
//! a listener whose `server.max_connections` is 4,096, then a health probe
//! and a real request on each listener are answered within a second; a
//! client that trickles its HTTP request head is cut at
//! `server.header_timeout`; with every HTTP slot busy, health and metrics
//! are still served on a reserved connection.
mod common;

use common::limits::{closed, http_head, reply, until_read_by_server};
use kvtier_proto::wire::Kind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const FLOOD: usize = 5_000;

/// Room for the flood's both ends in this one process.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let need = (2 * FLOOD + 1_000) as u64;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < need {
        assert!(
            hard >= need,
            "this test needs {need} open files; the hard limit is {hard} (raise `ulimit -Hn`)"
        );
        setrlimit(Resource::RLIMIT_NOFILE, need, hard).expect("setrlimit");
    }
}

async fn flood(addr: SocketAddr) -> Vec<TcpStream> {
    let mut socks = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        socks.push(TcpStream::connect(addr).await.expect("the kernel accepts"));
    }
    socks
}

async fn server() -> kvtier_server::Server {
    let mut cfg = common::test_config();
    cfg.server.data_listen = "127.0.0.1:0".into();
    assert_eq!(
        cfg.server.max_connections, 4096,
        "the default a flood must pass"
    );
    kvtier_server::Server::start(cfg).await.unwrap()
}

/// Within a second, or the flood took the listener down.
async fn soon<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(1), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within a second of the flood"));
    eprintln!("{what}: {:?}", t.elapsed());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_leaves_every_listener_answering() {
    raise_fd_limit();
    let s = server().await;
    // HTTP: the liveness probe and a real request.
    let http = s.http_addr.unwrap();
    let held = flood(http).await;
    soon("HTTP /healthz", async {
        let mut probe = TcpStream::connect(http).await.unwrap();
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let head = http_head(&mut probe).await.expect("answered");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    })
    .await;
    soon("HTTP PUT", async {
        let mut put = TcpStream::connect(http).await.unwrap();
        put.write_all(b"PUT /v1/kv/flood/k HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        let head = http_head(&mut put).await.expect("answered");
        assert!(head.starts_with("HTTP/1.1 20"), "{head}");
    })
    .await;
    drop(held);
    // gRPC: grpc.health.v1 and a Stats call on fresh connections.
    let grpc = s.grpc_addrs[0];
    let held = flood(grpc).await;
    soon("grpc.health.v1 Check", async {
        let ch = tonic::transport::Endpoint::new(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .expect("connects");
        let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
        h.check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("serving");
    })
    .await;
    soon("gRPC Stats", async {
        let mut cc = kvtier_client::ClientConfig::new(format!("http://{grpc}"));
        cc.connections = 1;
        cc.data_plane = false;
        cc.retries = 0;
        let c = kvtier_client::Client::connect(cc).await.expect("connects");
        c.stats().await.expect("answered");
    })
    .await;
    drop(held);
    // The data plane: a Read.
    let data = s.data_addr.unwrap();
    let held = flood(data).await;
    soon("data-plane Read", async {
        let mut sock = TcpStream::connect(data).await.unwrap();
        sock.write_all(&common::frame(Kind::Read, 1, &[], &[]))
            .await
            .unwrap();
        assert!(reply(&mut sock).await.is_some(), "answered");
    })
    .await;
    drop(held);
}

#[tokio::test]
async fn a_trickled_http_request_head_is_cut_at_the_header_timeout() {
    let mut cfg = common::test_config();
    cfg.server.header_timeout = Duration::from_millis(300);
    let s = kvtier_server::Server::start(cfg).await.unwrap();
    let mut slow = TcpStream::connect(s.http_addr.unwrap()).await.unwrap();
    let t = Instant::now();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .unwrap();
    assert!(closed(&mut slow, Duration::from_secs(5)).await, "cut");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn with_every_http_slot_busy_health_and_metrics_are_still_served() {
    let mut cfg = common::test_config();
    cfg.server.max_connections = 2;
    let s = kvtier_server::Server::start(cfg).await.unwrap();
    let http = s.http_addr.unwrap();
    // Two uploads in service, their bodies still to come: both slots busy.
    let mut busy = Vec::new();
    for i in 0..2 {
        let mut sock = TcpStream::connect(http).await.unwrap();
        sock.write_all(
            format!("PUT /v1/kv/busy/k{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nxx")
                .as_bytes(),
        )
        .await
        .unwrap();
        busy.push(sock);
    }
    for sock in &busy {
        until_read_by_server(sock).await;
    }
    // A request other than health or metrics: told every slot is busy.
    let mut other = TcpStream::connect(http).await.unwrap();
    other
        .write_all(b"GET /v1/kv/busy/k0 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let head = http_head(&mut other).await.expect("answered");
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    for path in ["/healthz", "/metrics"] {
        let mut probe = TcpStream::connect(http).await.unwrap();
        probe
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let head = http_head(&mut probe).await.expect("answered");
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    }
    for sock in &mut busy {
        assert!(
            !closed(sock, Duration::from_millis(50)).await,
            "busy connections kept"
        );
    }
}
