//! Which transport a client's reads and writes take, chosen once at connect
//! and logged once (a silent fall-back is what users of other KV stores
//! report most): the same-host socket when the client was given one
//! (`unix://PATH`) or when the server advertises one that leads back to it
//! (docs/local.md), else the TCP data plane (docs/wire.md), else gRPC.
use crate::config::{ClientConfig, connect_pool, data_plane_addr};
use crate::wire::{Target, WireClient};
use crate::{ClientError, Result};
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use tonic::transport::Channel;

/// The same-host socket's path, when `endpoint` is `unix://PATH` (or `unix:PATH`).
pub fn local_path(endpoint: &str) -> Option<&str> {
    crate::listener::local_path(endpoint)
}

/// What a connected client uses.
pub(crate) struct Chosen {
    /// gRPC over the same-host socket, replacing the TCP pool (an upgrade).
    pub(crate) grpc: Option<Vec<Channel>>,
    /// The data plane, if any.
    pub(crate) wire: Option<WireClient>,
}

/// Whether the data plane failed to connect for want of a usable answer
/// (refused, unreachable, timed out, a failed TLS handshake) rather than by
/// refusing this client's token: the former falls back.
fn unreachable(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)
    )
}

/// Picks the transport for a client whose gRPC pool answered `stats`.
pub(crate) async fn choose(cfg: &ClientConfig, stats: &pb::StatsResponse) -> Result<Chosen> {
    let mut chosen = Chosen {
        grpc: None,
        wire: None,
    };
    if let Some(path) = local_path(&cfg.endpoint) {
        let w = unix_plane(cfg, path, stats).await?;
        log_choice(cfg, &w, "given");
        chosen.wire = Some(w);
        return Ok(chosen);
    }
    if cfg.same_host && !stats.local_listen.is_empty() {
        match upgrade(cfg, stats).await {
            Ok(Some((grpc, w))) => {
                log_choice(cfg, &w, "advertised by the server");
                chosen.grpc = Some(grpc);
                chosen.wire = Some(w);
                return Ok(chosen);
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(
                path = %stats.local_listen,
                error = %e,
                "kvtier: the server's same-host socket is not usable from here"
            ),
        }
    }
    if stats.data_listen.is_empty() {
        tracing::info!(endpoint = %cfg.endpoint, "kvtier transport: gRPC (the server offers no data plane)");
        return Ok(chosen);
    }
    let addr = data_plane_addr(&cfg.endpoint, &stats.data_listen).await?;
    let tls = match &cfg.tls {
        Some(t) => Some(t.wire(&cfg.endpoint)?),
        None => None,
    };
    match WireClient::connect_tls(
        addr,
        data_connections(cfg),
        cfg.timeout,
        cfg.connect_timeout,
        cfg.data_tcp_congestion.as_deref(),
        cfg.token.as_deref(),
        tls,
    )
    .await
    {
        Ok(w) => {
            let w = w
                .with_max_stripes(cfg.read_stripes)
                .with_max_request(stats.max_message_size);
            log_choice(cfg, &w, "advertised by the server");
            chosen.wire = Some(w);
        }
        // Advertised but not reachable from here (a firewall, an address
        // behind NAT, a listener that never answers): Read/Write go over
        // gRPC, as with a server that offers no data plane.
        Err(e) if unreachable(&e) => {
            tracing::warn!(
                %addr,
                error = %e,
                "kvtier transport: gRPC (the data plane is advertised but unreachable)"
            );
        }
        Err(e) => return Err(e),
    }
    Ok(chosen)
}

fn data_connections(cfg: &ClientConfig) -> usize {
    if cfg.data_connections > 0 {
        cfg.data_connections
    } else {
        cfg.connections
    }
}

async fn unix_plane(
    cfg: &ClientConfig,
    path: &str,
    stats: &pb::StatsResponse,
) -> Result<WireClient> {
    Ok(WireClient::connect_local(
        path,
        data_connections(cfg),
        cfg.timeout,
        cfg.connect_timeout,
        cfg.token.as_deref(),
        cfg.server_uid,
    )
    .await?
    .with_max_stripes(cfg.read_stripes)
    .with_max_request(stats.max_message_size))
}

/// Moves to the same-host socket the server advertises, if it exists here
/// and leads to the same server (its Stats carry the same instance id: a
/// socket at that path on this host may belong to another kvtier).
async fn upgrade(
    cfg: &ClientConfig,
    stats: &pb::StatsResponse,
) -> Result<Option<(Vec<Channel>, WireClient)>> {
    let path = &stats.local_listen;
    if stats.instance_id == 0 || !std::path::Path::new(path).exists() {
        return Ok(None);
    }
    let mut local = cfg.clone();
    local.endpoint = format!("unix://{path}");
    local.tls = None;
    let grpc = connect_pool(&local).await?;
    let mut probe = KvTierClient::new(grpc[0].clone());
    let mut req = tonic::Request::new(pb::StatsRequest {});
    req.set_timeout(cfg.connect_timeout);
    if let Some(t) = cfg.token.as_deref().filter(|t| !t.is_empty()) {
        let v = format!("Bearer {t}")
            .parse()
            .map_err(|_| ClientError::Invalid("the token must be printable ASCII".into()))?;
        req.metadata_mut().insert("authorization", v);
    }
    let there = probe.stats(req).await?.into_inner();
    if there.instance_id != stats.instance_id {
        tracing::debug!(%path, "kvtier: the socket at this path is another server's");
        return Ok(None);
    }
    Ok(Some((grpc, unix_plane(&local, path, stats).await?)))
}

fn log_choice(cfg: &ClientConfig, w: &WireClient, how: &str) {
    match w.addr() {
        Target::Unix(p) => tracing::info!(
            endpoint = %cfg.endpoint,
            socket = %p.display(),
            "kvtier transport: same-host socket ({how}), payloads through shared memory"
        ),
        Target::Tcp(a) => tracing::info!(
            endpoint = %cfg.endpoint,
            data_plane = %a,
            "kvtier transport: TCP data plane ({how})"
        ),
    }
}
