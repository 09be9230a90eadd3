//! The HTTP key/value API and /metrics over a real socket.
mod common;

async fn http_base() -> (kvtier_server::Server, String) {
    let mut cfg = common::test_config();
    cfg.engine.max_block_size = kvtier_core::ByteSize(1 << 20);
    let server = kvtier_server::Server::start(cfg).await.unwrap();
    let base = format!("http://{}", server.http_addr.unwrap());
    (server, base)
}

#[tokio::test]
async fn put_get_delete_and_errors() {
    let (server, base) = http_base().await;
    let http = reqwest::Client::new();
    let url = format!("{base}/v1/kv/app/user:42");
    let r = http.put(&url).body(vec![5u8; 100]).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-kvtier-tier"], "memory");
    assert!(r.headers().contains_key("server-timing"));
    assert_eq!(r.bytes().await.unwrap().as_ref(), &[5u8; 100][..]);
    // PUT replaces (key/value semantics).
    http.put(&url).body("v2").send().await.unwrap();
    assert_eq!(
        http.get(&url).send().await.unwrap().text().await.unwrap(),
        "v2"
    );
    assert_eq!(http.delete(&url).send().await.unwrap().status(), 204);
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "not_found");
    assert!(body["error"].as_str().unwrap().contains("user:42"));
    assert_eq!(http.delete(&url).send().await.unwrap().status(), 404);

    // Over the limit: 413 with a JSON body naming the limit, nothing stored.
    let r = http
        .put(&url)
        .body(vec![0u8; (1 << 20) + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("1MiB"), "{body}");
    assert_eq!(http.get(&url).send().await.unwrap().status(), 404);

    // Bad namespace / bad query: 400 with a JSON body.
    let r = http
        .put(format!("{base}/v1/kv/bad%20ns/k"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("namespace"));
    let r = http
        .put(format!("{url}?ttl_ms=soon"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        http.get(format!("{base}/nope"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn ttl_expires_over_http() {
    let (server, base) = http_base().await;
    let http = reqwest::Client::new();
    let url = format!("{base}/v1/kv/app/short");
    assert_eq!(
        http.put(format!("{url}?ttl_ms=100"))
            .body("x")
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let s = http.get(&url).send().await.unwrap().status();
        if s == 404 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "value never expired");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    server.shutdown().await.unwrap();
}

/// An unknown query parameter (`ttl` for `ttl_ms`) is a 400 naming it, in
/// the same JSON shape as the other 400s, and nothing is stored.
#[tokio::test]
async fn unknown_query_parameter_is_refused() {
    let (server, base) = http_base().await;
    let http = reqwest::Client::new();
    let url = format!("{base}/v1/kv/app/typo");
    let r = http
        .put(format!("{url}?ttl=5"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "invalid_argument", "{body}");
    assert!(body["error"].as_str().unwrap().contains("`ttl`"), "{body}");
    assert_eq!(http.get(&url).send().await.unwrap().status(), 404);
    server.shutdown().await.unwrap();
}

/// A namespace with '/' travels percent-encoded as one path segment; sent
/// raw it is a 404 whose message says how to encode it.
#[tokio::test]
async fn namespace_with_slash_is_percent_encoded() {
    let (server, base) = http_base().await;
    let http = reqwest::Client::new();
    let url = format!("{base}/v1/kv/acme%2Fllama/k");
    assert_eq!(http.put(&url).body("v").send().await.unwrap().status(), 204);
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "v");
    let r = http
        .put(format!("{base}/v1/kv/acme/llama/k"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "no_route", "{body}");
    assert!(body["error"].as_str().unwrap().contains("%2F"), "{body}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn metrics_expose_the_documented_series() {
    let (server, base) = http_base().await;
    let http = reqwest::Client::new();
    http.put(format!("{base}/v1/kv/m/k"))
        .body("v")
        .send()
        .await
        .unwrap();
    http.get(format!("{base}/v1/kv/m/k")).send().await.unwrap();
    http.get(format!("{base}/v1/kv/m/missing"))
        .send()
        .await
        .unwrap();
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        "kvtier_requests_total{api=\"http\",op=\"put\",code=\"204\"} 1",
        "kvtier_requests_total{api=\"http\",op=\"get\",code=\"404\"} 1",
        "kvtier_request_duration_seconds_bucket{",
        "kvtier_tier_bytes{tier=\"memory\"}",
        "kvtier_tier_blocks{tier=\"memory\"} 1",
        "kvtier_tier_hits_total{tier=\"memory\"} 1",
        "kvtier_tier_misses_total{tier=\"memory\"} 1",
        "kvtier_tier_evictions_total{tier=\"memory\"} 0",
        "kvtier_tier_capacity_bytes{tier=\"memory\"}",
        "kvtier_active_leases",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    server.shutdown().await.unwrap();
}
