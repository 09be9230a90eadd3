//! Authentication of gRPC calls from their headers, before anything reads
//! or charges their bodies (docs/security.md, "Threats and their guards").
//!
//! Why: the handlers read `authorization` only once tonic has decoded the
//! whole request body, and [`crate::limits::ChargeLayer`] charges the body
//! to the shared `server.request_memory` as its frames arrive. A stalled
//! 14 MiB Lookup body from a client with no token (charged 9×) then held
//! the budget and authenticated writes were refused as busy until the
//! stream closed. This layer runs ahead of the charge: a call with no known
//! token is answered `UNAUTHENTICATED` on its headers, its body dropped
//! unread and uncharged.
//!
//! Generic on purpose: it knows nothing of the services but a list of path
//! prefixes that stay public (`grpc.health.v1` unless
//! `auth.public_health = false`). Namespace checks stay in the handlers,
//! which need the body; they also check the token again (cheap: one digest).
//! Cluster peers forward with the cluster token, a token of the tokens file
//! (docs/cluster.md), so their calls pass here like any other.
use crate::state::{Credential, Shared};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The health service's path prefix.
pub const HEALTH: &str = "/grpc.health.v1.Health/";

/// Tower layer: see the module docs.
#[derive(Clone)]
pub struct AuthnLayer {
    shared: Shared,
    /// Path prefixes served without a token.
    public: Arc<[&'static str]>,
}

impl AuthnLayer {
    /// Authenticates every call of `shared`'s server but those whose path
    /// starts with one of `public`.
    pub fn new(shared: Shared, public: Vec<&'static str>) -> Self {
        Self {
            shared,
            public: public.into(),
        }
    }
}

impl<S> tower::Layer<S> for AuthnLayer {
    type Service = AuthnService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AuthnService {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`AuthnLayer`].
#[derive(Clone)]
pub struct AuthnService<S> {
    inner: S,
    layer: AuthnLayer,
}

impl<S, B> tower::Service<http::Request<B>> for AuthnService<S>
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

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        use futures::future::Either;
        let shared = &self.layer.shared;
        let path = req.uri().path();
        if shared.auth.enabled() && !self.layer.public.iter().any(|p| path.starts_with(p)) {
            let headers = req.headers();
            let cred = Credential {
                authorization: headers
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok()),
                forwarded: headers.contains_key(crate::cluster::FORWARDED),
            };
            if let Err(refusal) = shared.caller(cred) {
                // The body is dropped unread: HTTP/2 resets the stream.
                let status = tonic::Status::from(refusal);
                return Either::Left(std::future::ready(Ok(status.into_http())));
            }
        }
        Either::Right(self.inner.call(req))
    }
}
