//! Connection limits (docs/operations.md): on the data plane, HTTP and
//! gRPC alike, a connection idle for `server.idle_timeout` is closed (a
//! busy one is kept), and past `server.max_connections` a new connection
//! takes the slot of the oldest idle one; only when every one is busy is it
//! closed at accept, while the held ones are still served. (Floods of
//! thousands: tests/floods.rs.)
mod common;

use common::limits::{closed, http_head, reply, server, until_read_by_server};
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

/// A data-plane Write whose header and metadata arrived and whose payload
/// is still to come: in service (busy) until `server.read_timeout`.
async fn busy_data_plane_connection(addr: std::net::SocketAddr) -> TcpStream {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let mut f = common::frame(Kind::Write, 1, &[], &[]);
    // Declare a 1 MiB payload, send none of it.
    f[20..24].copy_from_slice(&(1u32 << 20).to_le_bytes());
    sock.write_all(&f).await.unwrap();
    sock
}

#[tokio::test]
async fn a_full_data_plane_gives_the_oldest_idle_slot_to_a_new_connection() {
    let s = server(64 << 20, 3, 60_000, 60_000).await;
    let addr = s.data_addr.unwrap();
    let mut oldest = TcpStream::connect(addr).await.unwrap();
    let mut held = vec![
        TcpStream::connect(addr).await.unwrap(),
        TcpStream::connect(addr).await.unwrap(),
    ];
    // The fourth takes the oldest idle one's slot: that one is closed, the
    // newcomer and the others are served.
    let mut fourth = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed(&mut oldest, Duration::from_secs(5)).await,
        "the oldest idle connection gave its slot up"
    );
    for sock in held.iter_mut().chain([&mut fourth]) {
        sock.write_all(&common::frame(Kind::Read, 1, &[], &[]))
            .await
            .unwrap();
        assert!(reply(sock).await.is_some(), "still served");
    }
    drop((held, fourth));
    // Every slot busy: a new connection is closed at accept.
    let mut busy = Vec::new();
    for _ in 0..3 {
        busy.push(busy_data_plane_connection(addr).await);
    }
    for sock in &busy {
        until_read_by_server(sock).await;
    }
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed(&mut extra, Duration::from_secs(5)).await,
        "refused when every connection is busy"
    );
    for sock in &mut busy {
        assert!(
            !closed(sock, Duration::from_millis(100)).await,
            "a busy connection is never given away"
        );
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
    // Cap: with 2 held idle, a third takes the older one's slot.
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed(&mut a, Duration::from_secs(5)).await,
        "the oldest idle connection gave its slot up"
    );
    for x in [&mut b, &mut c] {
        x.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(http_head(x).await.unwrap().starts_with("HTTP/1.1 200"));
    }
}

#[tokio::test]
async fn a_full_grpc_listener_gives_the_oldest_idle_slot_to_a_new_connection() {
    let s = server(64 << 20, 2, 60_000, 60_000).await;
    let client = || one_connection_client(s.grpc_addrs[0]);
    // A raw connection that has spoken HTTP/2's preface is the oldest.
    let mut oldest = TcpStream::connect(s.grpc_addrs[0]).await.unwrap();
    oldest
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let b = client().await.expect("second");
    let c = client()
        .await
        .expect("a third gets the oldest idle one's slot");
    let mut sink = Vec::new();
    let eof = tokio::time::timeout(Duration::from_secs(5), oldest.read_to_end(&mut sink)).await;
    assert!(matches!(eof, Ok(Ok(_))), "the oldest was closed: {eof:?}");
    c.stats().await.expect("the newcomer serves");
    drop(b);
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
    // Busy (a request every 100 ms, for three idle timeouts): never closed
    // for idleness, so every call (no retries) is served on it.
    let busy_until = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < busy_until {
        a.stats().await.expect("the busy connection serves");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
