//! Opening data-plane connections is bounded by the connect timeout: a
//! listener that accepts and never answers (the Hello, the TLS handshake)
//! fails the connect instead of hanging it.
use kvtier_client::ClientTls;
use kvtier_client::wire::WireClient;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// A listener that accepts every connection and never writes a byte.
async fn silent_listener() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

/// `connect` within `limit` (10 s: the test fails, rather than hangs, without the bound).
async fn bounded<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("connect hung: no bound on opening a data-plane connection");
    (r, t.elapsed())
}

#[tokio::test]
async fn a_hello_never_answered_fails_the_connect_within_the_connect_timeout() {
    let addr = silent_listener().await;
    let (r, took) = bounded(WireClient::connect_tls(
        addr,
        4,
        Duration::from_secs(30),
        Duration::from_millis(300),
        None,
        Some("a-token"),
        None,
    ))
    .await;
    let err = r.err().expect("no connection can be opened");
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    // The four connections are opened at once: one connect timeout, not four.
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[tokio::test]
async fn a_tls_handshake_never_answered_fails_the_connect_within_the_connect_timeout() {
    let addr = silent_listener().await;
    let tls = ClientTls::default()
        .wire(&format!("http://{addr}"))
        .unwrap();
    let (r, took) = bounded(WireClient::connect_tls(
        addr,
        2,
        Duration::from_secs(30),
        Duration::from_millis(300),
        None,
        None,
        Some(tls),
    ))
    .await;
    let err = r.err().expect("no connection can be opened");
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}
