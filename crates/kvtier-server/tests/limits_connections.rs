//! Connection limits (docs/operations.md): on the data plane, HTTP and
//! gRPC alike, a connection idle for `server.idle_timeout` is closed (a
//! busy one is kept), and connections beyond `server.max_connections` are
//! closed at accept while the held ones are still served.
mod common;

use common::limits::{closed, http_head, reply, server};
use kvtier_proto::wire::Kind;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A gRPC client on one connection, no retries, that has been answered once.
async fn one_connection_client(
    addr: std::net::SocketAddr,
) -> Result<kvtier_client::Client, kvtier_client::ClientError> {
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{addr}"));
    cc.connections = 1;
    cc.data_plane = false;
    cc.retries = 0;
    cc.timeout = Duration::from_secs(3);
    let c = kvtier_client::Client::connect(cc).await?;
    c.stats().await?;
    Ok(c)
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let s = server(64 << 20, 100, 300, 60_000).await;
    let addr = s.data_addr.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    assert!(closed(&mut idle, Duration::from_secs(5)).await);
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    // Half a header counts as idle too.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"KVW1\x01").await.unwrap();
    assert!(closed(&mut half, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_accept() {
    let s = server(64 << 20, 3, 60_000, 60_000).await;
    let addr = s.data_addr.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // The fourth connection is accepted by the kernel but closed by the server
    // (it accepts in order, so the first three hold the slots by then).
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed(&mut extra, Duration::from_secs(5)).await,
        "fourth closed"
    );
    // The three held ones are still served.
    held[0]
        .write_all(&common::frame(Kind::Read, 1, &[], &[]))
        .await
        .unwrap();
    assert!(reply(&mut held[0]).await.is_some());
    drop(held);
    // Once others close, new connections are served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = TcpStream::connect(addr).await.unwrap();
        again
            .write_all(&common::frame(Kind::Read, 1, &[], &[]))
            .await
            .unwrap();
        if reply(&mut again).await.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "slots never freed");
    }
}

#[tokio::test]
async fn idle_and_surplus_http_connections_are_closed() {
    let s = server(64 << 20, 2, 300, 60_000).await;
    let addr = s.http_addr.unwrap();
    // Idle: no request at all, and a kept-alive connection after its request.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed(&mut idle, Duration::from_secs(5)).await,
        "idle HTTP connection closed"
    );
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let head = http_head(&mut kept).await.expect("answered");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // (the rest of the response, then EOF once the connection is idle)
    let mut rest = Vec::new();
    let eof = tokio::time::timeout(Duration::from_secs(5), kept.read_to_end(&mut rest)).await;
    assert!(
        matches!(eof, Ok(Ok(_))),
        "kept-alive connection closed when idle: {eof:?}"
    );
    // Cap: with 2 held, a third is closed at accept.
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let t = Instant::now();
    let n = tokio::time::timeout(Duration::from_millis(250), c.read_to_end(&mut buf)).await;
    assert!(
        matches!(n, Ok(Ok(0))),
        "third connection closed at once: {n:?}"
    );
    assert!(t.elapsed() < Duration::from_millis(250));
    for x in [&mut a, &mut b] {
        x.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(http_head(x).await.unwrap().starts_with("HTTP/1.1 200"));
    }
}

#[tokio::test]
async fn grpc_connections_beyond_the_cap_are_closed() {
    let s = server(64 << 20, 2, 60_000, 60_000).await;
    let client = || one_connection_client(s.grpc_addrs[0]);
    let a = client().await.expect("first");
    let b = client().await.expect("second");
    assert!(client().await.is_err(), "a third connection is refused");
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client().await.is_err() {
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.stats().await.expect("the held connection still serves");
}

#[tokio::test]
async fn idle_grpc_connections_are_closed_and_busy_ones_kept() {
    // One connection slot, 400 ms idle timeout: a second client gets in only
    // once the first one's connection was closed for idleness.
    let s = server(64 << 20, 1, 400, 60_000).await;
    let client = || one_connection_client(s.grpc_addrs[0]);
    // A raw TCP connection that never speaks is closed after the timeout.
    // (The server speaks first, its HTTP/2 SETTINGS; then EOF.)
    let mut silent = TcpStream::connect(s.grpc_addrs[0]).await.unwrap();
    let t = Instant::now();
    let mut sink = Vec::new();
    let eof = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut sink)).await;
    assert!(
        matches!(eof, Ok(Ok(_))),
        "silent connection closed: {eof:?}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t.elapsed()
    );
    let a = client().await.expect("first");
    // Busy (a request every 100 ms, for three idle timeouts): kept open, so
    // the slot stays taken.
    let busy_until = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < busy_until {
        a.stats().await.expect("the busy connection serves");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            TcpStream::connect(s.grpc_addrs[0]).await.is_ok(),
            "accept still works"
        );
    }
    assert!(
        client().await.is_err(),
        "the busy connection holds the slot"
    );
    // Idle: closed after the timeout, the slot comes back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        match client().await {
            Ok(b) => break b,
            Err(_) => {
                assert!(
                    Instant::now() < deadline,
                    "the idle connection was never closed"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    b.stats().await.expect("the new connection serves");
}
