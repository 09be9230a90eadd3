//! kvtier-server: the protocol fronts over one engine.
//!
//! ```text
//!   gRPC listener(s) ──┬─ kvtier.v1.KvTier ─────────┐
//!   (tonic, HTTP/2)    ├─ kvstore.KVStoreService ───┤
//!                      └─ grpc.health.v1 ───────────┤
//!   data plane (TCP) ─── KVW1 Read / Write ─────────┤
//!   same-host socket ─── gRPC + data plane, ────────┤
//!   (Unix)               ReadInto / WriteFrom       │
//!   HTTP listener ──── /v1/kv, /healthz, /metrics ──┤
//!                                                   ▼
//!                      Shared { engine, metrics, admission, auth, limits }
//!                                                   │
//!                 kvtier_core::Engine (tiers; in a cluster, peers over gRPC)
//! ```
//! Fronts know protocols, not storage: each translates its requests into calls
//! on [`kvtier_core::Engine`] and reports the server timing it measured.
//!
//! * Fronts: [`grpc`] (`kvtier.v1` and the seed's `kvstore`, on the same
//!   listeners), [`wire`] (the data plane, docs/wire.md), [`http`], [`local`]
//!   (the same-host socket, docs/local.md); [`messages`] and [`read`] are
//!   what more than one of them shares.
//! * The request layer every front goes through: [`state`] (`Shared`),
//!   [`auth`], [`admission`], [`limits`], [`timing`] and [`rx_stamp`] (when a
//!   request arrived), [`metrics`] (with `share_metrics`), [`status`] (core
//!   errors as statuses).
//! * Set-up: [`config`], [`tls`], [`numa`] (listeners on CPU sets),
//!   [`object`] (the object-store tier's wiring), [`cluster`] (membership and
//!   the engine's peers over gRPC, docs/cluster.md); this file starts it all
//!   ([`Server`]).
//! * [`fuzzing`]: the request-decoding path as one function for fuzzers.

pub mod admission;
mod admission_metrics;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod disk;
pub mod events;
pub mod fuzzing;
pub mod grpc;
pub mod http;
pub mod limits;
pub mod messages;
pub mod metrics;
pub mod numa;
pub mod object;
pub mod read;
pub mod refusal;
pub mod rx_stamp;
pub mod same_host;
mod share_metrics;
pub mod shm;
pub mod state;
pub mod status;
pub mod timing;
pub mod tls;
pub mod wire;

use anyhow::Context as _;
use config::Config;
use grpc::listen::{GrpcAccept, serve_grpc, serve_grpc_pinned};
use kvtier_core::Engine;
use kvtier_proto::kvstore::kv_store_service_server::KvStoreServiceServer;
use kvtier_proto::v1::kv_tier_server::KvTierServer;
use state::Shared;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A running server; drop or call [`Server::shutdown`] to stop it.
pub struct Server {
    /// Bound gRPC addresses (ephemeral ports resolved), in config order.
    pub grpc_addrs: Vec<SocketAddr>,
    /// Bound HTTP address, if enabled.
    pub http_addr: Option<SocketAddr>,
    /// Bound data-plane address, if enabled.
    pub data_addr: Option<SocketAddr>,
    /// Path of the same-host socket, if enabled (docs/local.md).
    pub same_host_path: Option<std::path::PathBuf>,
    /// The engine (for in-process use and tests).
    pub engine: Arc<Engine>,
    /// The token table (reload it on SIGHUP).
    pub auth: Arc<auth::Auth>,
    /// TLS certificate, key and client CA, when `[tls]` is on (reload them on SIGHUP).
    pub tls: Option<Arc<tls::Tls>>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<anyhow::Result<()>>,
    grace: Duration,
}

impl Server {
    /// Binds every listener and starts serving on the current Tokio runtime.
    pub async fn start(cfg: Config) -> anyhow::Result<Self> {
        cfg.validate()?;
        let peers = cluster::peers_for(&cfg.cluster, cfg.server.max_message_size.bytes())?;
        let events = events::hub_for(&cfg.events);
        let hub = events.as_ref().map(|(h, _)| h.clone() as _);
        let engine = Arc::new(build_engine_with(&cfg, peers.clone(), hub).await?);
        Self::start_inner(cfg, engine, peers, events).await
    }

    /// Like [`Server::start`] with a caller-built engine (e.g. with more tiers).
    pub async fn start_with_engine(cfg: Config, engine: Arc<Engine>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !cfg.cluster.enabled(),
            "a caller-built engine cannot join a cluster: use Server::start"
        );
        anyhow::ensure!(!cfg.events.enabled(), "[events] needs Server::start");
        Self::start_inner(cfg, engine, None, None).await
    }

    async fn start_inner(
        cfg: Config,
        engine: Arc<Engine>,
        peers: Option<Arc<cluster::GrpcPeers>>,
        events: Option<(Arc<events::EventHub>, events::HubReceiver)>,
    ) -> anyhow::Result<Self> {
        let auth = Arc::new(if cfg.auth.tokens_file.is_empty() {
            auth::Auth::disabled()
        } else {
            auth::Auth::from_file(std::path::Path::new(&cfg.auth.tokens_file))?
        });
        check_exposure(&cfg, auth.enabled())?;
        let tls = tls::Tls::load(&cfg.tls)?;
        let mut shared = Shared::new(engine.clone(), cfg.server.max_inflight);
        shared.advertise = Arc::new(state::Advertise::new(cfg.server.max_message_size.bytes()));
        if let Some(p) = &peers {
            shared.metrics = Arc::new(metrics::Metrics::with_cluster(
                engine.clone(),
                Some(p.metrics()),
            ));
            shared.local = Some(Arc::new(engine.local_twin()));
            shared.cluster_self = p.me().to_string();
            shared.peer_admission = Some(Arc::new(admission::Limiter::fixed(
                cfg.server.max_inflight,
                cfg.server.max_queued,
                cfg.server.queue_timeout,
            )));
            shared.cluster_authorization = cluster::token().map(|t| format!("Bearer {t}"));
            cluster::check_dns_token(&cfg.cluster, shared.cluster_authorization.is_some())?;
            anyhow::ensure!(
                !auth.enabled() || shared.cluster_authorization.is_some(),
                "[auth] is on in a cluster: set KVTIER_CLUSTER_TOKEN to a token of the tokens file with \
                 read-write access to every namespace (namespaces = [\"\"]), the same on every node \
                 (docs/cluster.md)"
            );
            if let Some(a) = &shared.cluster_authorization {
                // A token the others refuse would leave every node alone
                // (every peer call UNAUTHENTICATED): say so at start.
                auth.identify(Some(a))
                    .and_then(|p| p.check("", true))
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "KVTIER_CLUSTER_TOKEN: {}; it must be a token of the tokens file with \
                             read-write access to every namespace (namespaces = [\"\"])",
                            e.message()
                        )
                    })?;
            }
        }
        shared.auth = auth.clone();
        shared.public_metrics = cfg.auth.public_metrics;
        shared.public_health = cfg.auth.public_health;
        shared.limits = limits::Limits::new(
            cfg.request_memory(),
            cfg.server.max_connections,
            cfg.server.idle_timeout,
            cfg.server.read_timeout,
        )
        .with_connections(
            cfg.server.max_connections_per_client,
            cfg.server.header_timeout,
        )
        .with_replies(cfg.server.reply_memory.bytes(), cfg.server.write_timeout);
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let ev = events::attach(
            &cfg,
            events,
            peers.as_ref(),
            engine.clone(),
            stop_rx.clone(),
            &mut tasks,
        );
        let (node, published) = ev.await?;
        shared.node = node;
        if let Some((hub, m)) = published {
            (shared.events, shared.metrics) = (Some(hub), Arc::new(m));
        }
        let fronts = Fronts {
            cfg: &cfg,
            shared: &shared,
            tls: tls.as_ref(),
            stop_rx: &stop_rx,
        };
        let grpc_addrs = fronts.start_grpc(&mut tasks)?;
        let http_addr = fronts.start_http(&mut tasks).await?;
        let data_addr = fronts.start_data_plane(&mut tasks).await?;
        let same_host_path = fronts.start_same_host(&mut tasks)?;
        if let Some(p) = &peers
            && !cfg.cluster.dns.is_empty()
        {
            let target = cluster::dns_target(&cfg.cluster.dns)?;
            let task = p.spawn_dns(target, cfg.cluster.dns_interval, stop_rx.clone());
            tasks.spawn(async move { task.await? });
        }
        // Expired blocks are also dropped lazily on access; this bounds the memory
        // they hold when nobody asks for them.
        let eng = engine.clone();
        let mut rx = stop_rx.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => { eng.purge_expired(); }
                    _ = rx.wait_for(|s| *s) => return Ok(()),
                }
            }
        });
        Ok(Self {
            grpc_addrs,
            http_addr,
            data_addr,
            same_host_path,
            engine,
            auth,
            tls,
            stop,
            tasks,
            grace: cfg.server.shutdown_grace,
        })
    }

    /// Stops accepting, lets in-flight requests finish (up to the grace period).
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let grace = self.grace;
        if !self.engine.flush_object_uploads(grace).await {
            let pending = self.engine.stats().object.map_or(0, |o| o.queue_depth);
            tracing::warn!(
                pending,
                "write-back uploads still pending at shutdown; they are lost unless on disk"
            );
        }
        let drain = async {
            while let Some(r) = self.tasks.join_next().await {
                r??;
            }
            Ok::<_, anyhow::Error>(())
        };
        match tokio::time::timeout(grace, drain).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "shutdown grace period over; aborting remaining requests"
                );
                self.tasks.abort_all();
                Ok(())
            }
        }
    }

    /// Waits until a listener fails (normally never).
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        match self.tasks.join_next().await {
            Some(r) => r?,
            None => Ok(()),
        }
    }
}

type Tasks = JoinSet<anyhow::Result<()>>;

/// What starting a front needs.
struct Fronts<'a> {
    cfg: &'a Config,
    shared: &'a Shared,
    tls: Option<&'a Arc<tls::Tls>>,
    stop_rx: &'a watch::Receiver<bool>,
}

impl Fronts<'_> {
    /// Binds every gRPC listener (one per `server.listen` entry, or one per NUMA
    /// node) and serves them; returns their bound addresses in config order.
    fn start_grpc(&self, tasks: &mut Tasks) -> anyhow::Result<Vec<SocketAddr>> {
        let Fronts {
            cfg,
            shared,
            tls,
            stop_rx,
        } = *self;
        let mut grpc_addrs = Vec::new();
        // One concurrency limit per front (docs/operations.md).
        let grpc_shared = shared.for_front("grpc", &cfg.server);
        let idle = cfg.server.idle_timeout;
        for spec in cfg.listeners()? {
            let std_listener = std::net::TcpListener::bind(spec.addr)
                .with_context(|| format!("cannot listen for gRPC on {}", spec.addr))?;
            std_listener.set_nonblocking(true)?;
            let addr = std_listener.local_addr()?;
            grpc_addrs.push(addr);
            let router = grpc_router(cfg, grpc_shared.clone())?;
            let rx = stop_rx.clone();
            let accept = GrpcAccept {
                conns: shared.limits.conns(0),
                idle,
                tls: tls.map(|t| t.grpc_acceptor()),
                handshake_timeout: cfg.server.read_timeout,
            };
            match spec.cpus {
                None => {
                    let listener = tokio::net::TcpListener::from_std(std_listener)?;
                    tasks.spawn(serve_grpc(router, listener, rx, addr, accept));
                    tracing::info!(%addr, "gRPC listening (kvtier.v1, kvstore.KVStoreService, grpc.health.v1)");
                }
                Some(cpus) => {
                    tasks.spawn(serve_grpc_pinned(
                        router,
                        std_listener,
                        rx,
                        addr,
                        cpus.clone(),
                        accept,
                    )?);
                    tracing::info!(%addr, ?cpus, "gRPC listening on a pinned runtime");
                }
            }
        }
        Ok(grpc_addrs)
    }

    /// Binds and serves the HTTP API, if `server.http_listen` is set.
    async fn start_http(&self, tasks: &mut Tasks) -> anyhow::Result<Option<SocketAddr>> {
        let Fronts {
            cfg,
            shared,
            tls,
            stop_rx,
        } = *self;
        if cfg.server.http_listen.is_empty() {
            return Ok(None);
        }
        let a: SocketAddr = cfg.server.http_listen.parse()?;
        let listener = tokio::net::TcpListener::bind(a)
            .await
            .with_context(|| format!("cannot listen for HTTP on {a}"))?;
        let addr = listener.local_addr()?;
        let app = http::router(shared.for_front("http", &cfg.server));
        tasks.spawn(http::serve(
            listener,
            app,
            tls.map(|t| t.acceptor()),
            shared.limits.clone(),
            stop_rx.clone(),
        ));
        tracing::info!(%addr, "HTTP listening (/v1/kv, /healthz, /metrics)");
        Ok(Some(addr))
    }

    /// Binds and serves the bulk data plane, if `server.data_listen` enables it.
    async fn start_data_plane(&self, tasks: &mut Tasks) -> anyhow::Result<Option<SocketAddr>> {
        let Fronts {
            cfg,
            shared,
            tls,
            stop_rx,
        } = *self;
        let Some(a) = cfg.data_listen()? else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(a)
            .await
            .with_context(|| format!("cannot listen for the data plane on {a}"))?;
        let addr = listener.local_addr()?;
        wire::set_congestion(&listener, &cfg.server.data_tcp_congestion);
        let _ = shared.advertise.data_addr.set(addr);
        tasks.spawn(wire::serve(
            listener,
            tls.map(|t| t.acceptor()),
            shared.for_front("data", &cfg.server),
            cfg.server.max_message_size.bytes(),
            stop_rx.clone(),
        ));
        tracing::info!(%addr, "data plane listening (Read/Write payloads, docs/wire.md)");
        Ok(Some(addr))
    }
}

impl Fronts<'_> {
    /// Binds and serves the same-host socket, if `server.local_listen` is set.
    fn start_same_host(&self, tasks: &mut Tasks) -> anyhow::Result<Option<std::path::PathBuf>> {
        let Some(spec) = self.cfg.same_host_socket()? else {
            return Ok(None);
        };
        let bound = same_host::bind(&spec)?;
        let shared = self.shared.for_front("local", &self.cfg.server);
        let router = grpc_router(self.cfg, shared.clone())?;
        let _ = shared
            .advertise
            .same_host_path
            .set(spec.path.display().to_string());
        tasks.spawn(same_host::serve(
            bound,
            router,
            shared,
            self.cfg.server.max_message_size.bytes(),
            shm::Shm::new(spec.shared_memory),
            self.stop_rx.clone(),
        ));
        tracing::info!(
            path = %spec.path.display(),
            mode = format!("{:o}", spec.mode),
            shared_memory = spec.shared_memory,
            "same-host socket listening (gRPC + data plane; payloads through shared memory, docs/local.md)"
        );
        Ok(Some(spec.path))
    }
}

/// Builds the engine the config describes: memory, plus disk when `disk.dir`
/// is set, plus the object store when `object_store` names one.
/// With `[cluster]` set, the engine places blocks over the cluster's nodes.
pub async fn build_engine(cfg: &Config) -> anyhow::Result<Engine> {
    let peers = cluster::peers_for(&cfg.cluster, cfg.server.max_message_size.bytes())?;
    build_engine_with(cfg, peers, None).await
}

async fn build_engine_with(
    cfg: &Config,
    peers: Option<Arc<cluster::GrpcPeers>>,
    events: Option<Arc<dyn kvtier_core::events::EventSink>>,
) -> anyhow::Result<Engine> {
    let mut engine_cfg = cfg.engine.engine_config();
    engine_cfg.shares = cfg.tenants.shares();
    let builder =
        Engine::builder(engine_cfg).admission(cfg.disk.admission()?, cfg.object_store.admission()?);
    let builder = disk::attach(builder, cfg).await?;
    let builder = object::attach(builder, cfg)?.events(events);
    Ok(match peers {
        Some(p) => builder.peers(p).build(),
        None => builder.build(),
    })
}

/// Refuses to listen beyond loopback without authentication, unless the
/// operator said `auth.insecure` (`--insecure`), and then warns loudly.
fn check_exposure(cfg: &Config, authenticated: bool) -> anyhow::Result<()> {
    if authenticated {
        return Ok(());
    }
    let mut exposed: Vec<SocketAddr> = cfg
        .listeners()?
        .into_iter()
        .map(|l| l.addr)
        .filter(|a| !a.ip().is_loopback())
        .collect();
    if !cfg.server.http_listen.is_empty() {
        let a: SocketAddr = cfg.server.http_listen.parse()?;
        if !a.ip().is_loopback() {
            exposed.push(a);
        }
    }
    if let Some(a) = cfg.data_listen()?.filter(|a| !a.ip().is_loopback()) {
        exposed.push(a);
    }
    if exposed.is_empty() {
        return Ok(());
    }
    let list = exposed
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if !cfg.auth.insecure {
        anyhow::bail!(
            "refusing to listen on {list} without authentication: anyone who can reach it could \
             read, overwrite and delete every namespace. Give --auth-tokens FILE (docs/security.md), \
             or --insecure to accept that on a trusted network"
        );
    }
    tracing::warn!(
        "INSECURE: listening on {list} without authentication (--insecure): anyone who can reach \
         these ports can read, write and delete every namespace"
    );
    Ok(())
}

type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        grpc::late::LateLayer,
        tower::layer::util::Stack<
            limits::ChargeLayer,
            tower::layer::util::Stack<
                grpc::authn::AuthnLayer,
                tower::layer::util::Stack<timing::ArrivalLayer, tower::layer::util::Identity>,
            >,
        >,
    >,
>;

fn grpc_router(cfg: &Config, shared: Shared) -> anyhow::Result<GrpcRouter> {
    let max = cfg.server.max_message_size.bytes() as usize;
    let kvstore = KvStoreServiceServer::new(grpc::kvstore::KvStoreApi::new(
        shared.clone(),
        &cfg.kvstore,
    )?)
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let v1 = KvTierServer::new(grpc::v1::V1Service::new(shared.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let (health_reporter, _) = tonic_health::server::health_reporter();
    // grpc.health.v1 is open unless auth.public_health = false; then it needs a
    // known token like everything else.
    let health_auth = shared.clone();
    let health = tonic_health::pb::health_server::HealthServer::with_interceptor(
        tonic_health::server::HealthService::from_health_reporter(health_reporter.clone()),
        move |req: tonic::Request<()>| {
            if !health_auth.public_health {
                health_auth
                    .caller(crate::grpc::credential(req.metadata()))
                    .map_err(tonic::Status::from)?;
            }
            Ok(req)
        },
    );
    tokio::spawn(async move {
        health_reporter
            .set_serving::<KvTierServer<grpc::v1::V1Service>>()
            .await;
        health_reporter
            .set_serving::<KvStoreServiceServer<grpc::kvstore::KvStoreApi>>()
            .await;
    });
    // Server reflection (v1 and the older v1alpha that some tools still ask for).
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(kvtier_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    // Served without a token (grpc::authn); every other call needs one.
    let public = if cfg.auth.public_health {
        vec![grpc::authn::HEALTH]
    } else {
        Vec::new()
    };
    // TLS, when on, is done before tonic sees the connection (serve_grpc),
    // with the certificate current at accept time.
    Ok(tonic::transport::Server::builder()
        .initial_stream_window_size(Some(cfg.server.stream_window.bytes() as u32))
        .initial_connection_window_size(Some(cfg.server.connection_window.bytes() as u32))
        .max_frame_size(Some((1 << 24) - 1))
        .http2_keepalive_interval(Some(cfg.server.keepalive_interval))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(Some(cfg.server.max_streams_per_connection))
        .tcp_nodelay(true)
        .layer(timing::ArrivalLayer)
        // Authenticated on the headers before the body is read or charged.
        .layer(grpc::authn::AuthnLayer::new(shared.clone(), public))
        .layer(limits::ChargeLayer(shared.limits.clone()))
        .layer(grpc::late::LateLayer(shared.clone()))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(v1)
        .add_service(kvstore))
}
