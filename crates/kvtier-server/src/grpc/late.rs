//! Shedding gRPC requests that already queued too long before the server
//! read them, the gRPC counterpart of the data plane's socket check
//! (`wire`, docs/operations.md "Late requests").
//!
//! Over gRPC a request's HEADERS frame can wait in the socket, and then in
//! the HTTP/2 connection, while the server's one core serves others; the
//! admission limit only sees it once its handler runs (notes/029: p99 6.9×
//! the knee's at 10× the knee, with the adaptive limit at its floor). The
//! connection ([`crate::limits::Capped`]) keeps the kernel's receive stamp
//! of its last read (when every byte of that read came with the stamp); when
//! a request reaches this layer, the time since that stamp is a lower bound
//! for how long the request has waited.
//! Past what the front's limit allows ([`Limiter::too_late`]) it is refused
//! before its body is read or decoded: `UNAVAILABLE` with a retry hint, like
//! any shed request. The request's arrival is backdated by the same wait,
//! so queue time and `ServerTiming` include it.
//!
//! Only the storage services are shed here (not health checks or
//! reflection), and never a request forwarded by a cluster peer: peers have
//! their own limit.
use crate::admission::Refused;
use crate::state::Shared;
use crate::timing::Arrival;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Services whose requests pass admission (and may be shed here).
const SHED_PATHS: [&str; 2] = ["/kvtier.v1.KvTier/", "/kvstore.KVStoreService/"];

/// The longest socket wait believed: a stamp older than this is a stale
/// clock, not a queue.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Tower layer: see the module docs. Holds the gRPC front's state.
#[derive(Clone)]
pub struct LateLayer(pub Shared);

impl<S> tower::Layer<S> for LateLayer {
    type Service = LateService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        LateService {
            inner,
            shared: self.0.clone(),
        }
    }
}

/// See [`LateLayer`].
#[derive(Clone)]
pub struct LateService<S> {
    inner: S,
    shared: Shared,
}

impl<S, B> tower::Service<http::Request<B>> for LateService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures::future::Either<std::future::Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        use futures::future::Either;
        let waited = crate::limits::activity_of(req.extensions())
            .map(|a| crate::rx_stamp::waited(a.last_rx(), MAX_WAIT))
            .unwrap_or_default();
        if !waited.is_zero() {
            let now = Instant::now();
            if let Some(Arrival(t)) = req.extensions().get::<Arrival>().copied() {
                let earlier = now.checked_sub(waited).unwrap_or(now);
                req.extensions_mut().insert(Arrival(t.min(earlier)));
            }
            if self.sheddable(&req) && self.shared.admission.too_late(waited) {
                let status = tonic::Status::from(self.shared.shed(Refused::Late));
                return Either::Left(std::future::ready(Ok(status.into_http())));
            }
        }
        Either::Right(self.inner.call(req))
    }
}

impl<S> LateService<S> {
    fn sheddable<B>(&self, req: &http::Request<B>) -> bool {
        let path = req.uri().path();
        if !SHED_PATHS.iter().any(|p| path.starts_with(p)) {
            return false;
        }
        // A peer's forwarded request is admitted under the peers' limit.
        let headers = req.headers();
        let cred = crate::state::Credential {
            authorization: headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
            forwarded: headers.contains_key(crate::cluster::FORWARDED),
        };
        !(cred.forwarded && self.shared.is_peer_request(cred))
    }
}
