//! A client for a kvtier cluster (`kvtier serve --cluster-nodes ...`): one
//! [`Client`] per node, each block sent to a node that owns it.
//!
//! Any node of a cluster answers any request (it asks the owners, then the
//! object store), so a single-address [`Client`] works against a cluster; but
//! a block that does not live on the node asked costs a hop between nodes.
//! [`ClusterClient`] knows the node list and computes each block's owners
//! with the servers' own placement ([`kvtier_core::cluster::rank`] over the
//! node names, first `replicas` of the ranking), so every block goes to an
//! owner directly. It keeps no state about blocks: each call groups its keys
//! by first owner, sends each node its part (nodes in parallel) and puts the
//! answers back together in the caller's order. A node that does not answer
//! (`UNAVAILABLE`, a timeout, a refused connection) is skipped for
//! `down_for` and its part goes to each key's next owner. The semantics are
//! those of the Python SDK's `kvtier.ClusterClient` (python/kvtier/cluster.py).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kvtier_client::ClientError> {
//! use kvtier_client::{ClusterClient, ClusterConfig};
//! let c = ClusterClient::connect(ClusterConfig::new("grpc://10.0.0.1:50051,grpc://10.0.0.2:50051")).await?;
//! let tokens: Vec<u32> = (0..256).collect();
//! let hit = c.lookup_tokens("my-model", &tokens, None).await?;
//! let blocks = c.read("my-model", &hit.keys[..hit.found], 0).await?;
//! # let _ = blocks; Ok(()) }
//! ```
pub(crate) use crate::wire::add_timing;
use crate::{
    Client, ClientConfig, ClientError, Lookup, ReadResult, Result, ServerTiming, WriteBlock,
    WriteResult,
};
use bytes::Bytes;
use futures::future::join_all;
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod read;
mod route;

/// Owners per block unless told otherwise (the servers' `cluster.replicas` default).
pub const DEFAULT_REPLICAS: usize = 2;

/// How long a node that did not answer is skipped unless told otherwise.
pub const DEFAULT_DOWN_FOR: Duration = Duration::from_secs(5);

/// Settings of a [`ClusterClient`].
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The nodes' addresses (`grpc://host:port`, `http://host:port` or
    /// `host:port`): the list the servers were given (`--cluster-nodes`),
    /// since placement hashes the names (the address without its scheme).
    pub nodes: Vec<String>,
    /// Settings of every node's client (connections, deadline, retries,
    /// keys, token, TLS...); its `endpoint` is ignored.
    pub client: ClientConfig,
    /// Owners per block (the servers' `cluster.replicas`). Reads ask up to
    /// this many owners that answer before a block counts as missing.
    pub replicas: usize,
    /// A node that did not answer is skipped this long (unless every node is).
    pub down_for: Duration,
}

impl ClusterConfig {
    /// `nodes` as one comma-separated string (`grpc://h1:p1,grpc://h2:p2`),
    /// with the client defaults of [`ClientConfig::new`].
    pub fn new(nodes: &str) -> Self {
        let nodes = split_nodes(nodes);
        let first = nodes.first().map_or("", String::as_str);
        Self::with_client(nodes.clone(), ClientConfig::new(first))
    }

    /// A list of node addresses and the settings every node's client uses.
    pub fn with_client<S: Into<String>>(
        nodes: impl IntoIterator<Item = S>,
        client: ClientConfig,
    ) -> Self {
        Self {
            nodes: nodes.into_iter().map(Into::into).collect(),
            client,
            replicas: DEFAULT_REPLICAS,
            down_for: DEFAULT_DOWN_FOR,
        }
    }
}

/// The addresses of a comma-separated list, trimmed, empty items dropped.
pub fn split_nodes(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// A node's name in placement ([`kvtier_core::cluster::node_name`], the
/// function the server names its nodes with).
pub fn node_name(addr: &str) -> Result<String> {
    kvtier_core::cluster::node_name(addr).map_err(|e| ClientError::Invalid(e.message))
}

/// Whether an error means the node did not answer (as opposed to answering
/// with an error): then its part goes to the next owner. A node that shed
/// the request (UNAVAILABLE with a retry hint) answered: it is up but busy.
pub fn unreachable(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) if crate::pushback(s).is_some() => false,
        ClientError::Status(s) => matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
        ),
        ClientError::Transport(_) | ClientError::Unreachable { .. } => true,
        _ => false,
    }
}

/// One node: its name, its client's settings, and the client once connected
/// (a node down when the cluster client starts is connected when first used).
struct Node {
    name: String,
    cfg: ClientConfig,
    client: Mutex<Option<Client>>,
    /// Held while connecting, so callers do not connect the same node twice.
    connecting: tokio::sync::Mutex<()>,
}

struct Inner {
    nodes: Vec<Node>,
    /// The nodes' names in the order given (what placement ranks).
    names: Vec<String>,
    index: HashMap<String, usize>,
    replicas: usize,
    down_for: Duration,
    /// Deadline of a whole call (failovers included).
    timeout: Duration,
    base: ClientConfig,
    /// Per node: skipped until then, because it did not answer.
    down: Mutex<Vec<Option<Instant>>>,
    /// Lease id → (the node that granted it, when it expires).
    leases: Mutex<HashMap<u64, (usize, Instant)>>,
}

/// A client for a kvtier cluster, with [`Client`]'s calls. Cheap to clone.
///
/// How each call is routed (owners: the ranking over the nodes not skipped
/// as down; first owner: its first):
///
/// * [`write`](Self::write) / [`write_tokens`](Self::write_tokens) /
///   [`delete`](Self::delete): keys grouped by first owner, one request per
///   node, nodes in parallel. A node that does not answer is skipped and its
///   keys go to their next owner. A failure of one node's part (other than
///   not answering) leaves the other nodes' parts done.
/// * [`read`](Self::read): grouped the same way; the answer is in the
///   caller's order and ends at the first block no owner has. A block a node
///   does not return is asked of its next owner, up to `replicas` owners
///   that answered.
/// * [`lookup`](Self::lookup): the whole chain to the first owner of its
///   first key (any node answers for the whole cluster). A lease id belongs
///   to the node that granted it: [`release_lease`](Self::release_lease)
///   goes there; reads pass it on as is.
/// * [`stats`](Self::stats): every node's stats added up
///   ([`node_stats`](Self::node_stats) one by one).
///
/// Server timings of a call that asked several nodes are their sums.
#[derive(Clone)]
pub struct ClusterClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient")
            .field("nodes", &self.inner.names)
            .field("replicas", &self.inner.replicas)
            .finish()
    }
}

impl ClusterClient {
    /// Connects a client to every node (in parallel). Nodes that do not
    /// answer now are skipped for `down_for` and connected when next used;
    /// fails when none answers, or on settings no node can work with.
    pub async fn connect(cfg: ClusterConfig) -> Result<Self> {
        kvtier_core::keys::check_block_size(cfg.client.block_size)
            .map_err(|e| ClientError::Invalid(e.message))?;
        if cfg.nodes.is_empty() {
            return Err(ClientError::Invalid(
                "a cluster needs at least one node address".into(),
            ));
        }
        if cfg.replicas == 0 {
            return Err(ClientError::Invalid("replicas must be at least 1".into()));
        }
        let mut nodes = Vec::with_capacity(cfg.nodes.len());
        let mut index = HashMap::new();
        for addr in &cfg.nodes {
            let name = node_name(addr)?;
            if index.insert(name.clone(), nodes.len()).is_some() {
                return Err(ClientError::Invalid(format!("node listed twice: {name}")));
            }
            let mut c = cfg.client.clone();
            c.endpoint = format!("http://{name}");
            nodes.push(Node {
                name,
                cfg: c,
                client: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            });
        }
        let n = nodes.len();
        let inner = Arc::new(Inner {
            names: nodes.iter().map(|n| n.name.clone()).collect(),
            nodes,
            index,
            replicas: cfg.replicas,
            down_for: cfg.down_for,
            timeout: cfg.client.timeout,
            base: cfg.client,
            down: Mutex::new(vec![None; n]),
            leases: Mutex::new(HashMap::new()),
        });
        let me = Self { inner };
        let this = &me;
        let tries = join_all((0..n).map(|i| async move {
            let r = this.client_of(i).await;
            this.mark(i, !matches!(&r, Err(e) if unreachable(e)));
            r
        }))
        .await;
        let mut first_err = None;
        let mut any = false;
        for r in tries {
            match r {
                Ok(_) => any = true,
                Err(e) if unreachable(&e) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        match first_err {
            Some(e) if !any => Err(e),
            _ => Ok(me),
        }
    }

    /// The nodes' names (`host:port`), in the order given.
    pub fn nodes(&self) -> &[String] {
        &self.inner.names
    }

    /// Owners per block.
    pub fn replicas(&self) -> usize {
        self.inner.replicas
    }

    /// The settings every node's client uses (its endpoint: the first node's).
    pub fn config(&self) -> &ClientConfig {
        &self.inner.nodes[0].cfg
    }

    /// The single-node client of `node` (a name or an address), once
    /// connected: for calls this client does not route.
    pub fn node(&self, node: &str) -> Option<Client> {
        let i = *self.inner.index.get(&node_name(node).ok()?)?;
        self.inner.nodes[i].client.lock().clone()
    }

    /// The clients of the nodes connected so far, by name.
    pub fn node_clients(&self) -> Vec<(String, Client)> {
        self.inner
            .nodes
            .iter()
            .filter_map(|n| Some((n.name.clone(), n.client.lock().clone()?)))
            .collect()
    }

    /// The nodes skipped now, because they did not answer lately.
    pub fn down(&self) -> Vec<String> {
        let mask = self.down_mask();
        self.inner
            .names
            .iter()
            .zip(mask)
            .filter(|(_, d)| *d)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Where `key` lives now: its `replicas` first owners among the nodes
    /// not skipped as down (among all of them when every node is).
    pub fn owners(&self, ns: &str, key: &Key) -> Vec<String> {
        let mask = self.down_mask();
        let mut live: Vec<String> = self
            .inner
            .names
            .iter()
            .zip(&mask)
            .filter(|(_, d)| !**d)
            .map(|(n, _)| n.clone())
            .collect();
        if live.is_empty() {
            live = self.inner.names.clone();
        }
        kvtier_core::cluster::rank(&live, ns, key.as_bytes())
            .into_iter()
            .take(self.inner.replicas)
            .map(String::from)
            .collect()
    }

    // -- calls ------------------------------------------------------------

    /// Keys of the full blocks of `tokens` under the configured scheme.
    pub fn keys_for(&self, tokens: &[u32]) -> Vec<Key> {
        let c = &self.inner.base;
        c.hash
            .chain_salted(tokens, c.block_size, &c.salt)
            .expect("block size checked at connect")
    }

    /// How many leading `keys` are stored in the cluster: [`Client::lookup`]
    /// on the first owner of the first key.
    pub async fn lookup(&self, ns: &str, keys: &[Key], lease_ms: Option<u32>) -> Result<Lookup> {
        let (node, r) = self
            .to_first_owner(ns, keys.first(), |c| async move {
                c.lookup(ns, keys, lease_ms).await
            })
            .await?;
        self.remember_lease(r.lease_id, node, lease_ms.unwrap_or(0));
        Ok(r)
    }

    /// How many leading blocks of `tokens` are stored (keys computed here).
    pub async fn lookup_tokens(
        &self,
        ns: &str,
        tokens: &[u32],
        lease_ms: Option<u32>,
    ) -> Result<Lookup> {
        let keys = self.keys_for(tokens);
        self.lookup(ns, &keys, lease_ms).await
    }

    /// Stores each block on its first owner, nodes in parallel (the owner
    /// copies it to the other owners and the object store).
    pub async fn write(&self, ns: &str, blocks: &[WriteBlock]) -> Result<WriteResult> {
        let start = Instant::now();
        let rs = if blocks.is_empty() {
            let (_, r) = self
                .to_first_owner(ns, None, |c| async move { c.write(ns, &[]).await })
                .await?;
            vec![r]
        } else {
            let keys: Vec<&Key> = blocks.iter().map(|b| &b.key).collect();
            self.grouped(ns, &keys, |c, ix| async move {
                let part: Vec<WriteBlock> = ix.iter().map(|&i| blocks[i].clone()).collect();
                c.write(ns, &part).await
            })
            .await?
        };
        let mut out = WriteResult {
            stored: 0,
            existing: 0,
            deferred: 0,
            timing: ServerTiming::default(),
        };
        for r in &rs {
            out.stored += r.stored;
            out.deferred += r.deferred;
            out.existing += r.existing;
            add_timing(&mut out.timing, &r.timing);
        }
        tracing::trace!(nodes = rs.len(), elapsed = ?start.elapsed(), "cluster write");
        Ok(out)
    }

    /// Writes one payload per full block of `tokens`, chained parent to child.
    pub async fn write_tokens(
        &self,
        ns: &str,
        tokens: &[u32],
        payloads: &[Bytes],
    ) -> Result<WriteResult> {
        let keys = self.keys_for(tokens);
        let block_size = self.inner.base.block_size;
        if payloads.len() != keys.len() {
            return Err(ClientError::Invalid(format!(
                "{} payloads for {} full blocks of {block_size} tokens",
                payloads.len(),
                keys.len(),
            )));
        }
        let blocks: Vec<WriteBlock> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| WriteBlock {
                token_ids: Vec::new(),
                key: k.clone(),
                parent: i.checked_sub(1).map(|p| keys[p].clone()),
                token_count: block_size as u32,
                payload: payloads[i].clone(),
                ttl_ms: 0,
            })
            .collect();
        self.write(ns, &blocks).await
    }

    /// Deletes blocks (and their descendants) through each key's first owner
    /// (which deletes on every node); returns how many were removed.
    pub async fn delete(&self, ns: &str, keys: &[Key]) -> Result<u32> {
        if keys.is_empty() {
            let (_, r) = self
                .to_first_owner(ns, None, |c| async move { c.delete(ns, &[]).await })
                .await?;
            return Ok(r);
        }
        let refs: Vec<&Key> = keys.iter().collect();
        let rs = self
            .grouped(ns, &refs, |c, ix| async move {
                let part: Vec<Key> = ix.iter().map(|&i| keys[i].clone()).collect();
                c.delete(ns, &part).await
            })
            .await?;
        Ok(rs.iter().sum())
    }

    /// Ends a lease early, on the node that granted it (the first node when
    /// this client did not take it).
    pub async fn release_lease(&self, lease_id: u64) -> Result<()> {
        if lease_id == 0 {
            return Err(ClientError::Invalid("lease id 0 is not a lease".into()));
        }
        let node = self
            .inner
            .leases
            .lock()
            .remove(&lease_id)
            .map_or(0, |l| l.0);
        let deadline = self.deadline();
        self.part(node, deadline, |c| async move {
            c.release_lease(lease_id).await
        })
        .await
    }

    /// Each node's [`Client::stats`], or the error it answered with, by node name.
    pub async fn node_stats(&self) -> Vec<(String, Result<pb::StatsResponse>)> {
        let deadline = self.deadline();
        let outs = join_all(
            (0..self.inner.nodes.len())
                .map(|n| self.part(n, deadline, |c| async move { c.stats().await })),
        )
        .await;
        self.inner.names.iter().cloned().zip(outs).collect()
    }

    /// The nodes' stats added up: tiers by kind, leases and expired blocks
    /// summed (each replica of a block counts); `version` the nodes'
    /// versions (comma-separated when they differ); `data_listen` empty.
    /// Nodes that do not answer are left out ([`node_stats`](Self::node_stats)
    /// shows them); when none answers, or one answers with an error, that
    /// error is returned.
    pub async fn stats(&self) -> Result<pb::StatsResponse> {
        let mut ok = Vec::new();
        let mut down = None;
        for (_, r) in self.node_stats().await {
            match r {
                Ok(s) => ok.push(s),
                Err(e) if unreachable(&e) => {
                    down.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        if ok.is_empty() {
            return Err(down.unwrap_or_else(|| self.deadline_error()));
        }
        Ok(sum_stats(ok))
    }
}

/// Stats of several nodes added up (see [`ClusterClient::stats`]).
fn sum_stats(nodes: Vec<pb::StatsResponse>) -> pb::StatsResponse {
    let mut tiers: BTreeMap<i32, pb::TierStats> = BTreeMap::new();
    let mut out = pb::StatsResponse::default();
    let mut timing = ServerTiming::default();
    let mut versions = std::collections::BTreeSet::new();
    for s in nodes {
        for t in s.tiers {
            let acc = tiers.entry(t.tier).or_insert_with(|| pb::TierStats {
                tier: t.tier,
                ..Default::default()
            });
            acc.blocks += t.blocks;
            acc.bytes += t.bytes;
            acc.capacity_bytes += t.capacity_bytes;
            acc.hits += t.hits;
            acc.misses += t.misses;
            acc.evictions += t.evictions;
        }
        out.active_leases += s.active_leases;
        out.expired_blocks += s.expired_blocks;
        versions.insert(s.version);
        add_timing(&mut timing, &s.timing.unwrap_or_default());
    }
    out.tiers = tiers.into_values().collect();
    out.version = versions.into_iter().collect::<Vec<_>>().join(",");
    out.timing = Some(timing);
    out
}

impl ClusterClient {
    /// Reads `keys` from their owners: the blocks in `keys`' order, ending at
    /// the first block no owner has (as [`Client::read`]).
    pub async fn read(&self, ns: &str, keys: &[Key], lease_id: u64) -> Result<ReadResult> {
        read::read(self, ns, keys, lease_id).await
    }
}

#[cfg(test)]
mod tests;
