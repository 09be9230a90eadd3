//! The HTTP listener: connections admitted through the listener's table
//! (`limits::Conns`: a flood of idle connections gives its slots up to real
//! clients, one client cannot take them all, and health checks are answered
//! even when every slot is busy), each served by hyper's HTTP/1.1 with a
//! deadline for its request head (docs/operations.md, "Connection floods").
use crate::limits::{Busy, Limits, RESERVE, Slot};
use axum::Router;
use axum::body::Bytes;
use axum::response::Response;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Serves `app` on `listener` until `stop`: over TLS when `tls` is given;
/// past `server.max_connections` (per client `server.max_connections_per_client`)
/// a new connection takes the oldest idle one's slot, and when every slot
/// is busy [`RESERVE`] more may ask for `/healthz` and `/metrics` only; a
/// request head (also the wait for the next one on a kept-alive connection)
/// within `server.header_timeout`, the TLS handshake within
/// `server.read_timeout`. In-flight requests finish on stop.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<crate::tls::Acceptor>,
    limits: Limits,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let conns = limits.conns(RESERVE);
    let mut stopping = stop.clone();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let (sock, peer) = match r {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!(error = %e, "HTTP accept failed"); continue; }
                };
                let slot = match conns.admit(Some(peer.ip())) {
                    Ok(slot) => slot,
                    Err(full) => {
                        tracing::debug!(%peer, "HTTP: connection closed at accept: {full}");
                        continue;
                    }
                };
                let _ = sock.set_nodelay(true);
                let (app, tls, limits, stop) = (app.clone(), tls.clone(), limits.clone(), stop.clone());
                tokio::spawn(async move {
                    let r = match tls {
                        None => connection(sock, app, &limits, stop, slot).await,
                        Some(acceptor) => {
                            match tokio::time::timeout(limits.read_timeout, acceptor.accept(sock)).await {
                                Ok(Ok(s)) => connection(s, app, &limits, stop, slot).await,
                                Ok(Err(e)) => Err(e.into()),
                                Err(_) => Err(anyhow::anyhow!("TLS handshake timed out")),
                            }
                        }
                    };
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "HTTP connection closed");
                    }
                });
            }
            _ = stopping.wait_for(|s| *s) => return Ok(()),
        }
    }
}

async fn connection<S>(
    io: S,
    app: Router,
    limits: &Limits,
    mut stop: tokio::sync::watch::Receiver<bool>,
    slot: Slot,
) -> anyhow::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let evicted = slot.evicted();
    let slot = Arc::new(slot);
    let service = tower::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let (app, slot) = (app.clone(), slot.clone());
        async move { Ok::<_, std::convert::Infallible>(serve_one(app, &slot, req).await) }
    });
    let service = hyper_util::service::TowerToHyperService::new(service);
    // hyper's header timer runs from the connection's start and again after
    // each response, so it also closes kept-alive connections left idle
    // (tests/limits_connections.rs checks both), and a client that trickles
    // its head (slowloris) holds its connection no longer than this.
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    tokio::pin!(conn);
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::select! {
        r = conn.as_mut() => r?,
        _ = stopped => {
            conn.as_mut().graceful_shutdown();
            conn.await?;
        }
        // Given to a newer connection while idle: closed (a request that
        // raced the eviction is finished first).
        _ = evicted => {
            conn.as_mut().graceful_shutdown();
            conn.await?;
        }
    }
    Ok(())
}

/// One request: the connection is busy (its slot never given away) until
/// the response body is sent; on a reserved connection only health and
/// metrics are served.
async fn serve_one(
    app: Router,
    slot: &Slot,
    req: http::Request<hyper::body::Incoming>,
) -> Response {
    use tower::ServiceExt;
    let busy = slot.busy();
    if slot.reserved() && !matches!(req.uri().path(), "/healthz" | "/metrics") {
        return super::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "every connection is busy (server.max_connections): this one serves only /healthz and /metrics; retry with back-off",
        );
    }
    let resp = match app.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    resp.map(|inner| axum::body::Body::new(HoldingBody { inner, _busy: busy }))
}

/// A response body that keeps its connection marked busy until it is sent.
struct HoldingBody {
    inner: axum::body::Body,
    _busy: Busy,
}

impl Body for HoldingBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
