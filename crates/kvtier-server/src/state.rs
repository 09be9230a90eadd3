//! State shared by every front: the engine, metrics, admission control.
use crate::admission::{Limiter, Permit, Refused};
use crate::auth::{Auth, Denied, Principal};
use crate::metrics::Metrics;
use crate::refusal::{Kind, Refusal};
use crate::timing::{Arrival, Clock};
use kvtier_core::{Engine, Key, Namespace};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything a request handler needs. Its fields are the crate's own:
/// fronts reach the store and the limits through it, nothing outside does.
#[derive(Clone)]
pub struct Shared {
    /// The store.
    pub(crate) engine: Arc<Engine>,
    /// Metrics registry.
    pub(crate) metrics: Arc<Metrics>,
    /// Bounds requests served at once by this front; waiting for it is
    /// queue time (each front gets its own, see [`Shared::for_front`]).
    pub(crate) admission: Arc<Limiter>,
    /// What Stats tells clients about this server's fronts and limits.
    pub(crate) advertise: Arc<Advertise>,
    /// Who may do what (docs/security.md); allows everything when off.
    pub(crate) auth: Arc<Auth>,
    /// `/metrics` and `/healthz` (plus grpc.health.v1) without a token.
    pub(crate) public_metrics: bool,
    /// See `public_metrics`.
    pub(crate) public_health: bool,
    /// Request memory, connections, timeouts (docs/operations.md).
    pub(crate) limits: crate::limits::Limits,
    /// In a cluster, the engine's local twin: what serves requests other
    /// nodes forward here (docs/cluster.md).
    pub(crate) local: Option<Arc<Engine>>,
    /// This node's name in its cluster (`host:port`); empty outside one.
    pub(crate) cluster_self: String,
    /// `Bearer <KVTIER_CLUSTER_TOKEN>`: with authentication on, only a
    /// request carrying it may be served as forwarded by another node.
    pub(crate) cluster_authorization: Option<String>,
    /// In a cluster, the admission limit of requests other nodes forward:
    /// apart from the clients', so a flood of client requests sheds client
    /// requests, not the peer calls other nodes' admitted requests depend on.
    pub(crate) peer_admission: Option<Arc<Limiter>>,
    /// This node's name in lookups' `nodes` and in KV events: `[events]
    /// node`, else `cluster_self`, else its first gRPC listener.
    pub(crate) node: String,
    /// KV events (docs/events.md), when `[events]` is on.
    pub(crate) events: Option<Arc<crate::events::EventHub>>,
}

/// What Stats reports about the fronts and limits, so clients choose their
/// transport and size their requests (docs/wire.md, docs/local.md).
pub struct Advertise {
    /// Bound address of the bulk data plane, once listening.
    pub data_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// Path of the same-host socket, once listening.
    pub same_host_path: std::sync::OnceLock<String>,
    /// `server.max_message_size`: clients split larger writes.
    pub max_message_size: u64,
    /// Random at each start: a client checks that the same-host socket it
    /// found leads to the server it was given before upgrading to it.
    pub instance_id: u64,
}

impl Advertise {
    /// Nothing listening yet; a fresh instance id.
    pub fn new(max_message_size: u64) -> Self {
        Self {
            data_addr: Default::default(),
            same_host_path: Default::default(),
            max_message_size,
            instance_id: rand::random::<u64>() | 1,
        }
    }
}

/// A request admitted for service: its outcome (clock and metrics record)
/// and its place under the front's concurrency limit.
pub struct Admitted {
    /// Recorded in the metrics when dropped.
    pub outcome: Outcome,
    /// Given back when dropped.
    pub hold: Hold,
}

/// A request's place under its front's concurrency limit; given back when
/// dropped. A response that is sent after its handler returned (a read's
/// payloads) carries it, so the limit sees the sending.
pub struct Hold {
    _permit: Permit,
    metrics: Arc<Metrics>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.metrics.inflight.dec();
    }
}

/// A request's outcome in the metrics (`kvtier_requests_total`, the
/// latency histogram), recorded when dropped so that no exit path can
/// forget it: a handler sets its code with [`Outcome::set`]; one dropped
/// unset (its caller went away, its future was cancelled) is `cancelled`.
pub struct Outcome {
    /// The request's timing so far.
    pub clock: Clock,
    what: (&'static str, &'static str),
    code: Cow<'static, str>,
    metrics: Arc<Metrics>,
}

impl Outcome {
    /// The outcome to record: `ok`, a refusal's label, an HTTP status.
    pub fn set(&mut self, code: impl Into<Cow<'static, str>>) {
        self.code = code.into();
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        let (api, op) = self.what;
        let took = self.clock.queue() + self.clock.started.elapsed();
        self.metrics.observe(api, op, &self.code, took);
    }
}

/// A response stream that holds its request's admission until it is dropped
/// (after its last message was sent).
pub struct Holding<S> {
    /// The stream.
    pub inner: S,
    /// Given back with the stream.
    pub _hold: Hold,
}

impl<S: tokio_stream::Stream + Unpin> tokio_stream::Stream for Holding<S> {
    type Item = S::Item;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        std::pin::Pin::new(&mut self.inner).poll_next(cx)
    }
}

/// Who a request says it is, as each front reads it from its protocol
/// (gRPC metadata, HTTP headers, a data-plane Hello): the request layer
/// decides identity and routing from this alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credential<'a> {
    /// The `authorization` value (`Bearer <token>`), if any.
    pub authorization: Option<&'a str>,
    /// Whether the request says another node of the cluster forwarded it
    /// (docs/cluster.md); believed only as [`Shared::is_peer_request`] says.
    pub forwarded: bool,
}

impl Shared {
    /// Builds the shared state (authentication off).
    pub fn new(engine: Arc<Engine>, max_inflight: usize) -> Self {
        let metrics = Arc::new(Metrics::new(engine.clone()));
        Self {
            engine,
            metrics,
            admission: Arc::new({
                let d = crate::config::ServerSection::default();
                Limiter::fixed(max_inflight, d.max_queued, d.queue_timeout)
            }),
            advertise: Arc::new(Advertise::new(0)),
            auth: Arc::new(Auth::disabled()),
            public_metrics: true,
            public_health: true,
            limits: crate::limits::Limits::unlimited(),
            local: None,
            cluster_self: String::new(),
            cluster_authorization: None,
            peer_admission: None,
            events: None,
            node: String::new(),
        }
    }

    /// Whether a request comes from another node: anyone may claim so when
    /// authentication is off (a forwarded request only narrows what it
    /// sees: this node's tiers); with it on, only the cluster token does.
    pub(crate) fn is_peer_request(&self, cred: Credential<'_>) -> bool {
        if !self.auth.enabled() {
            return true;
        }
        match (&self.cluster_authorization, cred.authorization) {
            (Some(want), Some(got)) => {
                use sha2::{Digest, Sha256};
                // Compared as digests: no early exit on the first differing byte.
                Sha256::digest(want.as_bytes()) == Sha256::digest(got.as_bytes())
            }
            _ => false,
        }
    }

    /// The state a request sees: a request another node of the cluster
    /// forwarded (metadata [`crate::cluster::FORWARDED`]) is served by the
    /// local twin, so it never travels further; anything else by the engine.
    pub fn route(&self, cred: Credential<'_>) -> Cow<'_, Shared> {
        match &self.local {
            Some(local) if cred.forwarded && self.is_peer_request(cred) => {
                let mut s = self.clone();
                s.engine = local.clone();
                if let Some(a) = &self.peer_admission {
                    s.admission = a.clone();
                }
                Cow::Owned(s)
            }
            _ => Cow::Borrowed(self),
        }
    }

    /// A copy for one front (`grpc`, `http`, `data`) with its own
    /// concurrency limit (docs/operations.md, "Load shedding").
    pub fn for_front(&self, front: &'static str, cfg: &crate::config::ServerSection) -> Self {
        let gauge = self.metrics.concurrency_limit(front);
        let mut s = self.clone();
        s.admission = Arc::new(Limiter::from_config(
            cfg.concurrency_limit,
            cfg.max_inflight,
            cfg.max_queued,
            cfg.queue_timeout,
            gauge,
        ));
        s
    }

    /// Queues the token ids `blocks` carry for their KV events, before they
    /// are stored (docs/events.md).
    pub fn note_tokens(&self, blocks: &[kvtier_core::Block]) {
        if let Some(h) = &self.events {
            use kvtier_core::events::EventSink as _;
            for b in blocks {
                if let Some(t) = &b.tokens {
                    h.tokens(&b.meta.id, t.clone());
                }
            }
        }
    }

    /// The caller of a request, from its credential; refusals are counted.
    pub fn caller(&self, cred: Credential<'_>) -> Result<Principal, Refusal> {
        self.auth.identify(cred.authorization).map_err(|d| {
            self.metrics.observe_denied(&d);
            Refusal::from(d)
        })
    }

    /// Checks `who` may read (or write) `namespace`, counting refusals.
    pub fn allow(&self, who: &Principal, namespace: &str, write: bool) -> Result<(), Refusal> {
        who.check(namespace, write).map_err(|d: Denied| {
            self.metrics.observe_denied(&d);
            Refusal::from(d)
        })
    }

    /// Admits a request under this front's concurrency limit
    /// (`server.concurrency_limit`): static, at once while fewer than
    /// `server.max_inflight` are served, else after waiting in a queue of at
    /// most `server.max_queued` for at most `server.queue_timeout` (the wait
    /// counts as queue time); adaptive, at once under the limit measured
    /// latency sets. Past those it is shed ([`Shared::shed`]) rather than
    /// queued without bound (docs/operations.md). `what` is the request's
    /// `(api, op)` in the metrics its [`Outcome`] records.
    pub async fn admit(
        &self,
        what: (&'static str, &'static str),
        arrived: Option<Instant>,
    ) -> Result<Admitted, Refusal> {
        let mut clock = Clock::start(arrived);
        let permit = match self.admission.acquire().await {
            Ok(p) => p,
            Err(why) => return Err(self.shed(why)),
        };
        clock.admitted();
        self.metrics.inflight.inc();
        Ok(Admitted {
            outcome: Outcome {
                clock,
                what,
                code: "cancelled".into(),
                metrics: self.metrics.clone(),
            },
            hold: Hold {
                _permit: permit,
                metrics: self.metrics.clone(),
            },
        })
    }

    /// A request refused for overload, counted in `kvtier_shed_total` (not
    /// in the request metrics: it was never served): [`Kind::Overloaded`]
    /// with a hint of when to retry, which every front sends on (the clients
    /// retry it with jittered back-off).
    pub(crate) fn shed(&self, why: Refused) -> Refusal {
        self.metrics.shed.inc();
        let why = match why {
            Refused::QueueFull => "the admission queue is full",
            Refused::Timeout => "no capacity within server.queue_timeout",
            Refused::AtLimit => "at the adaptive concurrency limit",
            Refused::Late => "the request waited in its socket past the queueing the limit allows",
        };
        // Hint: about when the backlog (or the limit) will have moved.
        let hint_ms = self.admission.retry_hint().as_millis().clamp(10, 1000) as u64;
        let mut refusal = Refusal::new(
            Kind::Overloaded,
            format!(
                "server overloaded ({why}; {} requests in service, limit {}, {} waiting); retry in ~{hint_ms} ms with back-off",
                self.admission.inflight(),
                self.admission.limit(),
                self.admission.queued(),
            ),
        );
        refusal.retry_after = Some(Duration::from_millis(hint_ms));
        refusal
    }

    /// The request prologue and epilogue every front shares: admission under
    /// the front's concurrency limit (a shed request becomes `on_shed`), the
    /// request's clock, then its outcome in the metrics (`api`, `op`, and
    /// `code` of what `f` returned; `cancelled` if `f` never finished).
    /// Fronts keep only what differs: decoding, access checks and their own
    /// error representation. (Reads that hold their admission while the
    /// payload is sent call [`Shared::admit`] themselves: the permit outlives
    /// this scope.)
    pub async fn serve<R>(
        &self,
        what: (&'static str, &'static str),
        arrived: Option<Instant>,
        on_shed: impl FnOnce(Refusal) -> R,
        code: impl FnOnce(&R) -> Cow<'static, str>,
        f: impl AsyncFnOnce(&mut Clock) -> R,
    ) -> R {
        let Admitted { mut outcome, hold } = match self.admit(what, arrived).await {
            Ok(a) => a,
            Err(shed) => return on_shed(shed),
        };
        let r = f(&mut outcome.clock).await;
        outcome.set(code(&r));
        drop(hold);
        r
    }

    /// Records the outcome of a request refused before admission (its
    /// [`Outcome`] records every admitted one).
    pub fn observe(&self, api: &'static str, op: &'static str, code: &str, clock: &Clock) {
        self.metrics
            .observe(api, op, code, clock.queue() + clock.started.elapsed());
    }
}

/// Arrival time stamped by the arrival layer, if any.
pub fn arrival(ext: &http::Extensions) -> Option<Instant> {
    ext.get::<Arrival>().map(|a| a.0)
}

/// Validates a namespace.
pub fn namespace(s: &str) -> Result<Namespace, Refusal> {
    Namespace::new(s).map_err(Refusal::from)
}

/// Validates a list of keys, naming the offending index.
pub fn keys(raw: &[bytes::Bytes]) -> Result<Vec<Key>, Refusal> {
    raw.iter()
        .enumerate()
        .map(|(i, k)| {
            Key::new(k.clone()).map_err(|e| Refusal::from(e.context(format!("keys[{i}]"))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::EngineConfig;

    const WHAT: (&str, &str) = ("v1", "read");

    fn recorded(s: &Shared, code: &str) -> bool {
        s.metrics.encode().lines().any(|l| {
            l.starts_with("kvtier_requests_total")
                && l.contains(&format!("code=\"{code}\""))
                && !l.ends_with(" 0")
        })
    }

    #[tokio::test]
    async fn every_admitted_request_is_recorded_even_when_abandoned() {
        let s = Shared::new(Arc::new(Engine::new(EngineConfig::default())), 4);
        let mut served = s.admit(WHAT, None).await.expect("admitted");
        served.outcome.set("ok");
        drop(served);
        assert!(recorded(&s, "ok"));
        // A handler whose future is dropped mid-way never sets its code.
        let abandoned = s.admit(WHAT, None).await.expect("admitted");
        drop(abandoned);
        assert!(recorded(&s, "cancelled"), "{}", s.metrics.encode());
        assert_eq!(s.metrics.inflight.get(), 0, "admissions given back");
    }

    #[tokio::test]
    async fn forwarded_requests_have_their_own_admission_and_engine() {
        let engine = Arc::new(Engine::new(EngineConfig::default()));
        let mut s = Shared::new(engine.clone(), 1);
        s.local = Some(Arc::new(engine.local_twin()));
        s.peer_admission = Some(Arc::new(Limiter::fixed(1, 0, Duration::from_millis(10))));
        let forwarded = Credential {
            authorization: None,
            forwarded: true,
        };
        // Clients have used up the front's limit...
        let _client = s.admit(WHAT, None).await.expect("admitted");
        assert!(s.admit(WHAT, None).await.is_err(), "the front is full");
        // ...and a peer's call is still admitted, on the local twin.
        let peer = s.route(forwarded);
        assert!(!Arc::ptr_eq(&peer.engine, &engine), "served by the twin");
        let _p = peer
            .admit(WHAT, None)
            .await
            .expect("peers have their own limit");
        // Without the mark, a request is a client's.
        let plain = s.route(Credential::default());
        assert!(Arc::ptr_eq(&plain.engine, &engine));
    }

    #[tokio::test]
    async fn past_the_queue_requests_are_shed_with_a_retry_hint() {
        let mut s = Shared::new(Arc::new(Engine::new(EngineConfig::default())), 1);
        s.admission = Arc::new(Limiter::fixed(1, 1, Duration::from_millis(200)));
        let first = s.admit(WHAT, None).await.expect("admitted at once");
        // The second waits in the queue (its one place)...
        let s2 = s.clone();
        let second = tokio::spawn(async move { s2.admit(WHAT, None).await.map(|_| ()) });
        let t = Instant::now();
        while s.admission.queued() == 0 {
            assert!(t.elapsed() < Duration::from_secs(5), "never queued");
            tokio::task::yield_now().await;
        }
        // ...so the third is shed at once, with the hint clients act on.
        let t = Instant::now();
        let third = s.admit(WHAT, None).await.err().expect("shed");
        assert!(t.elapsed() < Duration::from_millis(100));
        assert_eq!(third.kind, Kind::Overloaded);
        assert!(third.message.contains("queue is full"), "{third:?}");
        assert_eq!(third.retry_after, Some(Duration::from_millis(200)));
        // The second is shed when queue_timeout passes without capacity.
        let e = second.await.unwrap().unwrap_err();
        assert!(e.message.contains("queue_timeout"), "{e:?}");
        assert!(t.elapsed() >= Duration::from_millis(150));
        assert_eq!(s.admission.queued(), 0, "queue places given back");
        // Capacity back: admitted again; waiting requests are admitted in turn.
        drop(first);
        let again = s.admit(WHAT, None).await.expect("admitted");
        let s3 = s.clone();
        let waiter = tokio::spawn(async move { s3.admit(WHAT, None).await.map(|_| ()) });
        tokio::task::yield_now().await;
        drop(again);
        waiter.await.unwrap().expect("admitted from the queue");
        assert_eq!(s.metrics.shed.get(), 2);
    }
}
