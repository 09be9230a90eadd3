//! [`GrpcPeers`]: the engine's [`Peers`] over `kvtier.v1` gRPC, with
//! membership, liveness and the cluster metrics.
//!
//! Liveness is learned from the calls themselves: a call that cannot reach
//! its node (refused, reset, timed out) marks the node down for
//! `cluster.down_for`, and placement skips it meanwhile, so one dead node
//! costs one failed call per `down_for`, not one per request. No heartbeat
//! traffic, no gossip: membership is the configured list or DNS.
use super::{ClusterSection, FORWARDED, node_name};
use async_trait::async_trait;
use kvtier_core::cluster::{Owners, PeerId, Peers, rank};
use kvtier_core::tier::{Overwrite, TierKind};
use kvtier_core::{Block, BlockId, Error, Key, Namespace, Result};
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use parking_lot::{Mutex, RwLock};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// Labels of per-peer counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerOpLabels {
    /// The other node, `host:port`.
    pub peer: String,
    /// `lookup`, `get`, `put` or `delete`.
    pub op: &'static str,
    /// `ok`, `miss` (a get the peer could not answer from its tiers) or `error`.
    pub result: &'static str,
}

/// Labels naming one peer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The other node, `host:port`.
    pub peer: String,
}

/// Labels of placement outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabels {
    /// `hit`: an owner had the block; `miss`: none did.
    pub result: &'static str,
}

/// The cluster's metric families (registered into `/metrics`).
#[derive(Clone, Default)]
pub struct ClusterMetrics {
    forwarded: Family<PeerOpLabels, Counter>,
    failovers: Family<PeerLabels, Counter>,
    placement: Family<PlacementLabels, Counter>,
    members: Gauge,
}

impl ClusterMetrics {
    /// Registers the families under `kvtier_cluster_*`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cluster_forwarded_requests",
            "Requests this node sent to another node, by peer, operation and result",
            self.forwarded.clone(),
        );
        registry.register(
            "cluster_failovers",
            "Calls to a peer that failed (unreachable or timed out); the peer is skipped for cluster.down_for",
            self.failovers.clone(),
        );
        registry.register(
            "cluster_placement_reads",
            "Reads of a block this node does not hold, by whether an owner had it (hit) or the object store was next (miss)",
            self.placement.clone(),
        );
        registry.register(
            "cluster_members",
            "Nodes in the cluster as this node sees it (itself included)",
            self.members.clone(),
        );
    }
}

struct Peer {
    name: String,
    client: KvTierClient<Channel>,
    down_until: Mutex<Option<Instant>>,
}

struct Members {
    /// Every member's name, this node's included.
    names: Vec<String>,
    /// Name → peer (this node has none).
    ids: HashMap<String, PeerId>,
}

/// The other nodes, reached over gRPC.
pub struct GrpcPeers {
    me: String,
    replicas: usize,
    timeout: Duration,
    down_for: Duration,
    max_message: usize,
    /// Every peer ever seen (append-only, so a [`PeerId`] stays valid while
    /// membership changes under a request).
    peers: RwLock<Vec<Arc<Peer>>>,
    members: RwLock<Members>,
    token: Option<tonic::metadata::AsciiMetadataValue>,
    metrics: ClusterMetrics,
    /// DNS membership: the name each address last reported, and when.
    learned: Mutex<HashMap<std::net::SocketAddr, (String, Instant)>>,
}

/// How long a DNS member that stops answering Stats keeps its place.
const LEARN_GRACE: Duration = Duration::from_secs(30);

impl GrpcPeers {
    /// Peers for `cfg` (validated); the static node list, if any, is the
    /// membership. `token` (from `KVTIER_CLUSTER_TOKEN`) authenticates this
    /// node to the others when they check tokens.
    pub fn new(
        cfg: &ClusterSection,
        max_message: usize,
        token: Option<String>,
    ) -> anyhow::Result<Arc<Self>> {
        let token = token
            .map(|t| {
                format!("Bearer {t}").parse().map_err(|_| {
                    anyhow::anyhow!("KVTIER_CLUSTER_TOKEN is not a valid header value")
                })
            })
            .transpose()?;
        let me = node_name(&cfg.self_)?;
        let p = Arc::new(Self {
            me: me.clone(),
            replicas: cfg.replicas.max(1),
            timeout: cfg.peer_timeout,
            down_for: cfg.down_for,
            max_message,
            peers: RwLock::new(Vec::new()),
            members: RwLock::new(Members {
                names: vec![me],
                ids: HashMap::new(),
            }),
            token,
            metrics: ClusterMetrics::default(),
            learned: Mutex::new(HashMap::new()),
        });
        let names = cfg
            .nodes
            .iter()
            .map(|n| node_name(n))
            .collect::<anyhow::Result<Vec<_>>>()?;
        p.set_members(names)?;
        Ok(p)
    }

    /// This node's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The members' names, this node's included, sorted.
    pub fn members(&self) -> Vec<String> {
        self.members.read().names.clone()
    }

    /// The metric families (to register into the server's registry).
    pub fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// Replaces the membership with `names` (this node is always a member).
    pub fn set_members(&self, mut names: Vec<String>) -> anyhow::Result<()> {
        if !names.contains(&self.me) {
            names.push(self.me.clone());
        }
        names.sort();
        names.dedup();
        let mut ids = HashMap::new();
        let mut unusable = Vec::new();
        for n in names.iter().filter(|n| **n != self.me) {
            match self.peer_for(n) {
                Ok(p) => {
                    ids.insert(n.clone(), p);
                }
                Err(e) => {
                    tracing::warn!(node = %n, error = %e, "cluster member left out");
                    unusable.push(n.clone());
                }
            }
        }
        names.retain(|n| !unusable.contains(n));
        let mut m = self.members.write();
        if m.names != names {
            tracing::info!(members = ?names, "cluster membership");
        }
        self.metrics.members.set(names.len() as i64);
        *m = Members { names, ids };
        Ok(())
    }

    fn peer_for(&self, name: &str) -> anyhow::Result<PeerId> {
        if let Some(i) = self.peers.read().iter().position(|p| p.name == name) {
            return Ok(i);
        }
        let ep = Endpoint::from_shared(format!("http://{name}"))?
            .connect_timeout(self.timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(32 << 20))
            .initial_connection_window_size(Some(64 << 20));
        let client = KvTierClient::new(ep.connect_lazy())
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message);
        let mut peers = self.peers.write();
        peers.push(Arc::new(Peer {
            name: name.to_string(),
            client,
            down_until: Mutex::new(None),
        }));
        Ok(peers.len() - 1)
    }

    /// Resolves `name:port` every `interval` and makes the answer the
    /// membership, until `stop` turns true. A failed resolution keeps the
    /// last membership.
    pub fn spawn_dns(
        self: &Arc<Self>,
        target: (String, u16),
        interval: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<anyhow::Result<()>> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
                match tokio::net::lookup_host((target.0.as_str(), target.1)).await {
                    Ok(addrs) => {
                        if let Err(e) = me.learn(addrs.collect()).await {
                            tracing::warn!(error = %e, "cluster DNS answer not usable");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(name = %target.0, error = %e, "cluster DNS lookup failed; keeping the last membership")
                    }
                }
            }
        })
    }

    /// Makes the nodes at `addrs` the membership, each under the name it
    /// reports (`StatsResponse.cluster_self`) rather than its address: a
    /// Kubernetes pod keeps its name (`kvtier-0.<headless service>`) across
    /// restarts while its IP changes, and placement must follow the name for
    /// a restarted pod to own what its disk holds. Every resolution asks
    /// again (one Stats call per node per `cluster.dns_interval`): an IP may
    /// pass to another pod. An address that does not answer is left out this
    /// round (not ready yet).
    pub async fn learn(&self, addrs: Vec<std::net::SocketAddr>) -> anyhow::Result<()> {
        let mut names = Vec::with_capacity(addrs.len());
        let asks = addrs
            .into_iter()
            .map(|a| async move { (a, self.ask_name(a).await) });
        let answers = futures::future::join_all(asks).await;
        let now = Instant::now();
        let mut learned = self.learned.lock();
        // DNS is the authority on who may be a member: forget the rest.
        learned.retain(|a, _| answers.iter().any(|(b, _)| a == b));
        for (a, name) in answers {
            match name {
                Some(n) => {
                    learned.insert(a, (n.clone(), now));
                    names.push(n);
                }
                // A member that missed one Stats (a blip, or shedding) stays
                // for LEARN_GRACE under the name it last gave: one slow round
                // must not move every placement. Calls to it mark it down if
                // it is really gone.
                None => {
                    if let Some((n, seen)) = learned.get(&a)
                        && now.duration_since(*seen) < LEARN_GRACE
                    {
                        names.push(n.clone());
                    }
                }
            }
        }
        drop(learned);
        self.set_members(names)
    }

    /// The name the node at `a` reports, if it answers and the name is a
    /// usable `host:port`.
    async fn ask_name(&self, a: std::net::SocketAddr) -> Option<String> {
        let ep = Endpoint::from_shared(format!("http://{a}"))
            .ok()?
            .connect_timeout(self.timeout)
            .timeout(self.timeout);
        let mut c = KvTierClient::new(ep.connect().await.ok()?);
        let mut req = tonic::Request::new(pb::StatsRequest {});
        if let Some(t) = &self.token {
            req.metadata_mut().insert("authorization", t.clone());
        }
        let name = c.stats(req).await.ok()?.into_inner().cluster_self;
        if name.is_empty() {
            return Some(a.to_string());
        }
        match node_name(&name) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(addr = %a, error = %e, "a node reports an unusable cluster name; left out");
                None
            }
        }
    }

    fn peer(&self, p: PeerId) -> Arc<Peer> {
        self.peers.read()[p].clone()
    }

    fn alive(&self, p: &Peer) -> bool {
        let mut d = p.down_until.lock();
        match *d {
            Some(t) if Instant::now() < t => false,
            Some(_) => {
                *d = None;
                true
            }
            None => true,
        }
    }

    /// A request marked as forwarded, with this node's token and a timeout
    /// inside the caller's deadline.
    fn request<T>(&self, msg: T, replace: bool) -> (tonic::Request<T>, Duration) {
        let budget = kvtier_core::deadline::budget(self.timeout);
        let mut r = tonic::Request::new(msg);
        r.set_timeout(budget);
        let md = r.metadata_mut();
        md.insert(
            FORWARDED,
            if replace { "replace" } else { "1" }
                .parse()
                .expect("ascii"),
        );
        if let Some(t) = &self.token {
            md.insert("authorization", t.clone());
        }
        (r, budget)
    }

    /// Runs one call to `p` within `budget`, counting it; a failure to
    /// reach the node marks it down.
    async fn call<T>(
        &self,
        p: &Peer,
        op: &'static str,
        budget: Duration,
        fut: impl std::future::Future<Output = std::result::Result<T, tonic::Status>>,
    ) -> Result<T> {
        if budget < Duration::from_millis(5) {
            // The caller's deadline has (all but) passed: not the peer's fault.
            return Err(Error::deadline(format!(
                "no time left to ask peer {}",
                p.name
            )));
        }
        let r = match tokio::time::timeout(budget, fut).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {budget:?}"
            ))),
        };
        let result = if r.is_ok() { "ok" } else { "error" };
        self.metrics
            .forwarded
            .get_or_create(&PeerOpLabels {
                peer: p.name.clone(),
                op,
                result,
            })
            .inc();
        r.map_err(|st| {
            use tonic::Code::*;
            // Down means unreachable: not a peer shedding load (it answered,
            // with a retry hint), nor a call cut short by the caller's own
            // deadline; marking those down would move placements for nothing.
            let unreachable = match st.code() {
                Unavailable => !st.metadata().contains_key("grpc-retry-pushback-ms"),
                DeadlineExceeded => budget >= self.timeout,
                Unknown | Cancelled => true,
                _ => false,
            };
            if unreachable {
                *p.down_until.lock() = Some(Instant::now() + self.down_for);
                self.metrics
                    .failovers
                    .get_or_create(&PeerLabels {
                        peer: p.name.clone(),
                    })
                    .inc();
                tracing::warn!(peer = %p.name, op, error = %st.message(), "cluster peer unreachable; skipping it for a while");
            }
            Error::unavailable(format!("peer {} {op}: {}", p.name, st.message()))
        })
    }
}

fn pb_block(b: &Block) -> pb::Block {
    let ttl_ms = crate::messages::ttl_left(b);
    pb::Block {
        key: b.meta.id.key.bytes(),
        parent_key: b
            .meta
            .parent
            .as_ref()
            .map_or_else(bytes::Bytes::new, Key::bytes),
        token_count: b.meta.token_count,
        crc32c: b.meta.crc32c,
        payload: b.payload.clone(),
        ttl_ms,
        // The owner publishes KV events for its copy (docs/events.md).
        token_ids: b.tokens.as_deref().map(<[u32]>::to_vec).unwrap_or_default(),
    }
}

#[async_trait]
impl Peers for GrpcPeers {
    fn owners(&self, id: &BlockId) -> Owners {
        let m = self.members.read();
        let mut out = Owners::default();
        let mut n = 0;
        for name in rank(&m.names, id.namespace.as_str(), id.key.as_bytes()) {
            if n == self.replicas {
                break;
            }
            if name == self.me {
                out.local = true;
                n += 1;
            } else if let Some(&p) = m.ids.get(name)
                && self.alive(&self.peer(p))
            {
                out.peers.push(p);
                n += 1;
            }
        }
        out
    }

    fn ranked(&self, id: &BlockId) -> Vec<Option<PeerId>> {
        let m = self.members.read();
        rank(&m.names, id.namespace.as_str(), id.key.as_bytes())
            .into_iter()
            .filter_map(|name| match m.ids.get(name) {
                _ if name == self.me => Some(None),
                Some(&p) if self.alive(&self.peer(p)) => Some(Some(p)),
                _ => None,
            })
            .collect()
    }

    fn live(&self) -> Vec<PeerId> {
        let m = self.members.read();
        m.ids
            .values()
            .copied()
            .filter(|&p| self.alive(&self.peer(p)))
            .collect()
    }

    fn name(&self, p: PeerId) -> String {
        self.peer(p).name.clone()
    }

    async fn lookup(&self, p: PeerId, ns: &Namespace, keys: &[Key]) -> Result<Vec<TierKind>> {
        let peer = self.peer(p);
        let (req, budget) = self.request(
            pb::LookupRequest {
                namespace: ns.to_string(),
                keys: keys.iter().map(Key::bytes).collect(),
                ..Default::default()
            },
            false,
        );
        let mut c = peer.client.clone();
        let r = self
            .call(&peer, "lookup", budget, async move { c.lookup(req).await })
            .await?;
        let r = r.into_inner();
        let n = (r.found_blocks as usize).min(keys.len());
        // A peer answers from its memory or disk only; anything else it
        // reports (an older node without tiers) counts as its memory.
        Ok((0..n)
            .map(|i| match r.tiers.get(i).copied() {
                Some(t) if t == pb::Tier::Disk as i32 => TierKind::Disk,
                _ => TierKind::Memory,
            })
            .collect())
    }

    async fn get(&self, p: PeerId, id: &BlockId) -> Result<Option<Block>> {
        let peer = self.peer(p);
        let (req, budget) = self.request(
            pb::ReadRequest {
                namespace: id.namespace.to_string(),
                keys: vec![id.key.bytes()],
                lease_id: 0,
            },
            false,
        );
        let mut c = peer.client.clone();
        let max = self.max_message as u64;
        let got = self
            .call(&peer, "get", budget, async move {
                let mut s = c.read(req).await?.into_inner();
                while let Some(msg) = s.message().await? {
                    if let Some(pb::read_response::Item::Block(b)) = msg.item {
                        return Ok(b.block);
                    }
                }
                Ok(None)
            })
            .await?;
        let result = if got.is_some() { "hit" } else { "miss" };
        self.metrics
            .placement
            .get_or_create(&PlacementLabels { result })
            .inc();
        match got {
            None => Ok(None),
            Some(b) => {
                // Verified like any block a client sends: a peer's bytes are not trusted blindly.
                let block =
                    crate::messages::block_from_pb(&id.namespace, 0, b, max).map_err(|st| {
                        Error::data_loss(format!("peer {}: {}", peer.name, st.message))
                    })?;
                if block.meta.id != *id {
                    return Err(Error::data_loss(format!(
                        "peer {} answered a read with another key",
                        peer.name
                    )));
                }
                Ok(Some(block))
            }
        }
    }

    async fn put(&self, p: PeerId, block: Block, mode: Overwrite) -> Result<()> {
        let peer = self.peer(p);
        let (req, budget) = self.request(
            pb::WriteRequest {
                namespace: block.meta.id.namespace.to_string(),
                blocks: vec![pb_block(&block)],
            },
            mode == Overwrite::Replace,
        );
        let mut c = peer.client.clone();
        self.call(&peer, "put", budget, async move { c.write(req).await })
            .await?;
        Ok(())
    }

    async fn delete(&self, p: PeerId, id: &BlockId) -> Result<u64> {
        let peer = self.peer(p);
        let (req, budget) = self.request(
            pb::DeleteRequest {
                namespace: id.namespace.to_string(),
                keys: vec![id.key.bytes()],
            },
            false,
        );
        let mut c = peer.client.clone();
        let r = self
            .call(&peer, "delete", budget, async move { c.delete(req).await })
            .await?;
        Ok(r.into_inner().deleted as u64)
    }
}
