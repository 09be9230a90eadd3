//! State shared by every front: the engine, metrics, admission control.
use crate::auth::{Auth, Denied, Principal};
use crate::metrics::Metrics;
use crate::timing::{Arrival, Clock};
use kvtier_core::{Engine, Key, Namespace};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Everything a request handler needs.
#[derive(Clone)]
pub struct Shared {
    /// The store.
    pub engine: Arc<Engine>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Bounds requests served at once; waiting for it is queue time.
    pub admission: Arc<Semaphore>,
    /// Bound address of the bulk data plane, once listening (reported by Stats).
    pub data_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
    /// Who may do what (docs/security.md); allows everything when off.
    pub auth: Arc<Auth>,
    /// `/metrics` and `/healthz` (plus grpc.health.v1) without a token.
    pub public_metrics: bool,
    /// See `public_metrics`.
    pub public_health: bool,
    /// Request memory, connections, timeouts (docs/operations.md).
    pub limits: crate::limits::Limits,
}

/// A request admitted for service: its clock and its admission permit.
pub struct Admitted {
    /// Timing so far.
    pub clock: Clock,
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.metrics.inflight.dec();
    }
}

impl Shared {
    /// Builds the shared state (authentication off).
    pub fn new(engine: Arc<Engine>, max_inflight: usize) -> Self {
        let metrics = Arc::new(Metrics::new(engine.clone()));
        Self {
            engine,
            metrics,
            admission: Arc::new(Semaphore::new(max_inflight)),
            data_addr: Default::default(),
            auth: Arc::new(Auth::disabled()),
            public_metrics: true,
            public_health: true,
            limits: crate::limits::Limits::unlimited(),
        }
    }

    /// The caller of a gRPC request, from its `authorization` metadata.
    pub fn caller(&self, md: &tonic::metadata::MetadataMap) -> Result<Principal, tonic::Status> {
        self.auth
            .identify(crate::auth::grpc_authorization(md))
            .map_err(|d| {
                self.metrics.observe_denied(&d);
                d.status()
            })
    }

    /// Checks `who` may read (or write) `namespace`, counting refusals.
    pub fn allow(
        &self,
        who: &Principal,
        namespace: &str,
        write: bool,
    ) -> Result<(), tonic::Status> {
        who.check(namespace, write).map_err(|d: Denied| {
            self.metrics.observe_denied(&d);
            d.status()
        })
    }

    /// Waits for admission; the wait counts as queue time.
    pub async fn admit(&self, arrived: Option<Instant>) -> Admitted {
        let mut clock = Clock::start(arrived);
        let permit = self
            .admission
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        clock.admitted();
        self.metrics.inflight.inc();
        Admitted {
            clock,
            _permit: permit,
            metrics: self.metrics.clone(),
        }
    }

    /// Records the outcome of a request.
    pub fn observe(&self, api: &'static str, op: &'static str, code: &str, clock: &Clock) {
        self.metrics
            .observe(api, op, code, clock.queue() + clock.started.elapsed());
    }
}

/// Arrival time stamped by the arrival layer, if any.
pub fn arrival(ext: &http::Extensions) -> Option<Instant> {
    ext.get::<Arrival>().map(|a| a.0)
}

/// Validates a namespace into a gRPC status error.
pub fn namespace(s: &str) -> Result<Namespace, tonic::Status> {
    Namespace::new(s).map_err(crate::status::to_status)
}

/// Validates a list of keys, naming the offending index.
pub fn keys(raw: &[bytes::Bytes]) -> Result<Vec<Key>, tonic::Status> {
    raw.iter()
        .enumerate()
        .map(|(i, k)| {
            Key::new(k.clone())
                .map_err(|e| tonic::Status::invalid_argument(format!("keys[{i}]: {}", e.message)))
        })
        .collect()
}

/// The request deadline from the `grpc-timeout` header, if the client set one.
pub fn deadline(md: &tonic::metadata::MetadataMap, arrived: Instant) -> Option<Instant> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    arrived.checked_add(d)
}

/// Name of a gRPC code for metrics labels.
pub fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        Ok => "ok",
        Cancelled => "cancelled",
        Unknown => "unknown",
        InvalidArgument => "invalid_argument",
        DeadlineExceeded => "deadline_exceeded",
        NotFound => "not_found",
        AlreadyExists => "already_exists",
        PermissionDenied => "permission_denied",
        ResourceExhausted => "resource_exhausted",
        FailedPrecondition => "failed_precondition",
        Aborted => "aborted",
        OutOfRange => "out_of_range",
        Unimplemented => "unimplemented",
        Internal => "internal",
        Unavailable => "unavailable",
        DataLoss => "data_loss",
        Unauthenticated => "unauthenticated",
    }
}
