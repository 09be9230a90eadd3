//! The HTTP front: a seed-004-style key/value API over the same engine, plus
//! `/healthz` and `/metrics`.
//!
//! | method | path | success | errors |
//! |---|---|---|---|
//! | PUT | `/v1/kv/{namespace}/{key}?ttl_ms=N` | 204 | 400 (also for an unknown query parameter), 413 (over `engine.max_block_size` or `server.request_memory`), 503 (busy), 507 (JSON body) |
//! | GET | `/v1/kv/{namespace}/{key}` | 200 + bytes | 404 (JSON body) |
//! | DELETE | `/v1/kv/{namespace}/{key}` | 204 | 404 |
//! | POST | `/v1/lookup` (JSON, `lookup.rs`) | 200 + JSON | 400, 401, 403 |
//! | GET | `/healthz` | 200 | |
//! | GET | `/metrics` | 200 Prometheus text | |
//!
//! With authentication on (docs/security.md) every request but the public
//! `/healthz` and `/metrics` needs `Authorization: Bearer TOKEN`: 401 without
//! a known token, 403 for a namespace the token may not use (or a write with a
//! read-only token), decided before the request body is read.
//!
//! Values are stored as blocks whose key is the UTF-8 key; they live in the same
//! tiers as KV-cache blocks and a PUT replaces the previous value.
// Handlers return early with a ready `Response` as the error value; boxing it
// would only add an allocation to every error path.
#![allow(clippy::result_large_err)]

use crate::refusal::{Kind, Refusal};
use crate::state::Shared;
use crate::status::{http_status, to_http};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use kvtier_core::{Block, BlockId, Error, Key, Namespace};
use serde::Deserialize;
use std::time::Instant;

mod listen;
mod lookup;
pub use listen::serve;

const API: &str = "http";

/// Builds the router.
pub fn router(shared: Shared) -> Router {
    let limit = shared.engine.config().max_block_size.bytes() as usize;
    Router::new()
        .route(
            "/v1/kv/{namespace}/{key}",
            get(get_value).put(put_value).delete(delete_value),
        )
        .route("/v1/lookup", axum::routing::post(lookup::lookup))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            hold_body,
        ))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            authorize,
        ))
        .with_state(shared)
}

/// Charges a request's body to `server.request_memory` before it is read
/// (its Content-Length, or the largest body accepted when it has none), for
/// as long as the request is served. A Content-Length over the largest block
/// or over the whole budget can never be accepted: 413, checked first, busy
/// or not. Past what is free of the budget: 503 with Retry-After. Either way
/// the body is not stored, only drained after the answer ([`refuse`]). The
/// whole request must be served within `server.read_timeout` (a stalled
/// upload then gives its memory back: 408).
async fn hold_body(
    State(s): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let limit = s.engine.config().max_block_size.bytes();
    let has_body = !matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::DELETE
    );
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .filter(|_| has_body);
    // A body that can never be accepted is 413 even when the server is busy
    // (a 503 would have the client retry it forever).
    let never = match declared {
        Some(n) if n > limit => Some(format!(
            "value of {n} bytes exceeds the maximum block size of {} (engine.max_block_size)",
            s.engine.config().max_block_size
        )),
        Some(n) if n > s.limits.memory_bytes => Some(format!(
            "a request of {n} bytes is larger than the server's request memory ({} bytes, server.request_memory)",
            s.limits.memory_bytes
        )),
        _ => None,
    };
    if let Some(msg) = never {
        if *req.method() == axum::http::Method::PUT {
            s.observe(API, "put", "413", &crate::timing::Clock::start(None));
        }
        crate::limits::refused::log("http_too_large", &msg);
        let resp = error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", msg);
        return refuse(&s, req, declared, resp);
    }
    let need = if has_body {
        declared.unwrap_or(limit).min(limit)
    } else {
        0
    };
    let _held = match s.limits.reserve(need) {
        Ok(r) => r,
        Err(status) => {
            s.metrics.shed.inc();
            // Counted like every other answered request (the handler, which
            // records the rest, never runs): kvtier_requests_total{code="503"}.
            if *req.method() == axum::http::Method::PUT {
                s.observe(API, "put", "503", &crate::timing::Clock::start(None));
            }
            crate::limits::refused::log("http_busy", &status.message);
            // It fits the budget (checked above), just not now: a 503 to retry.
            return refuse(&s, req, declared, refused(status));
        }
    };
    match tokio::time::timeout(s.limits.read_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => error(
            StatusCode::REQUEST_TIMEOUT,
            "deadline_exceeded",
            "request not served within server.read_timeout",
        ),
    }
}

/// `resp` for a request refused before its body was read. The body is read
/// and thrown away after the answer (at most its announced length, 1 GiB and
/// 5 s or `server.read_timeout`), so that the client, still sending, gets the
/// answer rather than a reset connection, and the connection can be kept. A
/// client that sent `Expect: 100-continue` sent no body yet: none is asked for.
fn refuse(
    s: &Shared,
    req: axum::extract::Request,
    declared: Option<u64>,
    resp: Response,
) -> Response {
    let expects = req
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects || declared == Some(0) {
        return resp;
    }
    drain(
        s,
        req.into_body().into_data_stream(),
        declared.unwrap_or(u64::MAX),
    );
    resp
}

/// Reads and throws away up to `left` more bytes of `body` (at most 1 GiB,
/// for at most 5 s or `server.read_timeout`), in the background: hyper keeps
/// reading a request's body while its response is written, and keeps the
/// connection once the body is done (it closes it if the body is dropped
/// unfinished).
fn drain(s: &Shared, mut body: axum::body::BodyDataStream, left: u64) {
    let cap = left.min(crate::limits::refused::DRAIN_BYTES);
    let time = crate::limits::refused::drain_time(s.limits.read_timeout);
    tokio::spawn(tokio::time::timeout(time, async move {
        use futures::StreamExt;
        let mut read = 0u64;
        while read < cap {
            match body.next().await {
                Some(Ok(b)) => read += b.len() as u64,
                _ => return,
            }
        }
    }));
}

/// A PUT's body, at most `engine.max_block_size` of it. One sent without a
/// Content-Length (chunked) is only found too large while it arrives: 413,
/// and the rest drained so that the client, still sending, gets the answer.
async fn read_body(s: &Shared, body: axum::body::Body) -> Result<Bytes, Response> {
    use futures::StreamExt;
    let limit = s.engine.config().max_block_size.bytes();
    let hint = http_body::Body::size_hint(&body).exact().unwrap_or(0);
    let mut buf = bytes::BytesMut::with_capacity(hint.min(limit) as usize);
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| error(StatusCode::BAD_REQUEST, "bad_body", e.to_string()))?;
        if (buf.len() + chunk.len()) as u64 > limit {
            let msg = format!(
                "value exceeds the maximum block size of {} (engine.max_block_size)",
                s.engine.config().max_block_size
            );
            crate::limits::refused::log("http_too_large", &msg);
            drain(s, stream, u64::MAX);
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                msg,
            ));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Authentication and access control, before any extractor reads the body.
async fn authorize(
    State(s): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path();
    let public =
        (path == "/healthz" && s.public_health) || (path == "/metrics" && s.public_metrics);
    if !public && s.auth.enabled() {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let checked = s.auth.identify(bearer).and_then(|who| {
            match path
                .strip_prefix("/v1/kv/")
                .and_then(|r| r.split('/').next())
            {
                Some(raw) => {
                    let ns = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
                    let write = !matches!(
                        *req.method(),
                        axum::http::Method::GET | axum::http::Method::HEAD
                    );
                    who.check(&ns, write)
                }
                None => Ok(()),
            }
        });
        if let Err(d) = checked {
            s.metrics.observe_denied(&d);
            return refused(d.into());
        }
    }
    next.run(req).await
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into(), "code": code });
    (status, Json(body)).into_response()
}

/// The answer to a refusal: its HTTP status and JSON body; `Retry-After`
/// (whole seconds, at least 1) when it was shed for overload, and
/// `WWW-Authenticate` when credentials are missing or unknown.
fn refused(r: Refusal) -> Response {
    let (status, code) = http_status(r.kind);
    let retry_after = r
        .retry_after
        .map(|d| d.as_secs_f64().ceil().max(1.0) as u64);
    let mut resp = error(status, code, r.message);
    let headers = resp.headers_mut();
    match (r.kind, retry_after) {
        (Kind::Overloaded, Some(secs)) => {
            if let Ok(v) = secs.to_string().parse() {
                headers.insert(header::RETRY_AFTER, v);
            }
        }
        (Kind::Overloaded, None) => {
            headers.insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        (Kind::Unauthenticated, _) => {
            headers.insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        _ => {}
    }
    resp
}

fn core_error(e: Error) -> Response {
    let (status, code) = to_http(&e);
    error(status, code, e.message)
}

fn id(ns: &str, key: &str) -> Result<BlockId, Response> {
    let ns = Namespace::new(ns).map_err(core_error)?;
    let key = Key::new(Bytes::copy_from_slice(key.as_bytes())).map_err(core_error)?;
    Ok(BlockId::new(ns, key))
}

/// The query of a PUT; an unknown parameter (a typo such as `ttl=5`) is a 400
/// naming it rather than silently ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutParams {
    ttl_ms: Option<u64>,
}

async fn put_value(
    State(s): State<Shared>,
    Path((ns, key)): Path<(String, String)>,
    params: Result<Query<PutParams>, axum::extract::rejection::QueryRejection>,
    body: axum::body::Body,
) -> Response {
    // Read first, as an extractor would: whatever the answer, the client
    // sent its body and must find it taken.
    let body = read_body(&s, body).await;
    handle(&s, "put", async |clock| {
        let Query(params) = params
            .map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_argument", e.body_text()))?;
        let body = body?;
        let id = id(&ns, &key)?;
        let len = body.len() as u64;
        let mut block = Block::new(id, None, 0, body);
        block.meta.expire_after_ms(params.ttl_ms.unwrap_or(0));
        s.engine
            .put_value(block, &mut clock.storage)
            .await
            .map_err(core_error)?;
        s.metrics.bytes_in.inc_by(len);
        Ok::<_, Response>(StatusCode::NO_CONTENT.into_response())
    })
    .await
}

async fn get_value(State(s): State<Shared>, Path((ns, key)): Path<(String, String)>) -> Response {
    handle(&s, "get", async |clock| {
        let id = id(&ns, &key)?;
        match s
            .engine
            .read(&id, &mut clock.storage)
            .await
            .map_err(core_error)?
        {
            Some((b, tier)) => {
                s.metrics.bytes_out.inc_by(b.payload.len() as u64);
                Ok((
                    [
                        (header::CONTENT_TYPE, "application/octet-stream"),
                        (
                            header::HeaderName::from_static("x-kvtier-tier"),
                            tier.name(),
                        ),
                    ],
                    b.payload,
                )
                    .into_response())
            }
            None => Err(error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("key {key:?} not found in namespace {ns:?}"),
            )),
        }
    })
    .await
}

async fn delete_value(
    State(s): State<Shared>,
    Path((ns, key)): Path<(String, String)>,
) -> Response {
    handle(&s, "delete", async |clock| {
        let id = id(&ns, &key)?;
        match s
            .engine
            .delete(&id, &mut clock.storage)
            .await
            .map_err(core_error)?
        {
            0 => Err(error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("key {key:?} not found in namespace {ns:?}"),
            )),
            _ => Ok(StatusCode::NO_CONTENT.into_response()),
        }
    })
    .await
}

/// Handles request `op` through the shared prologue ([`Shared::serve`]): 503
/// when shed, the `server-timing` header on every answer, the HTTP status as
/// the metrics outcome.
async fn handle(
    s: &Shared,
    op: &'static str,
    f: impl AsyncFnOnce(&mut crate::timing::Clock) -> Result<Response, Response>,
) -> Response {
    let code = |r: &Response| r.status().as_u16().to_string().into();
    s.serve(
        (API, op),
        Some(Instant::now()),
        refused,
        code,
        async |clock| {
            let resp = f(clock).await.unwrap_or_else(|r| r);
            with_timing(resp, clock)
        },
    )
    .await
}

fn with_timing(mut resp: Response, clock: &crate::timing::Clock) -> Response {
    let t = clock.finish();
    if let Ok(v) = format!(
        "queue;dur={:.3}, service;dur={:.3}, storage;dur={:.3}",
        t.queue_us as f64 / 1e3,
        t.service_us as f64 / 1e3,
        (t.storage_memory_us + t.storage_disk_us + t.storage_object_us + t.storage_peer_us) as f64
            / 1e3
    )
    .parse()
    {
        resp.headers_mut()
            .insert(header::HeaderName::from_static("server-timing"), v);
    }
    resp
}

async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    // `/v1/kv/acme/llama/k`: a namespace (or key) with a '/' in it must be
    // sent percent-encoded, as one path segment each.
    let nested = uri
        .path()
        .strip_prefix("/v1/kv/")
        .is_some_and(|rest| rest.split('/').count() > 2);
    let message = if nested {
        "no such endpoint: /v1/kv/ takes exactly two path segments, {namespace}/{key}; \
         percent-encode a '/' inside a namespace or key as %2F (namespace acme/llama: \
         /v1/kv/acme%2Fllama/{key})"
    } else {
        "no such endpoint; see /v1/kv/{namespace}/{key}, /healthz, /metrics"
    };
    error(StatusCode::NOT_FOUND, "no_route", message)
}
