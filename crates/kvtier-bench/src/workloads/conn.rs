//! Connecting to the system under test: a [`Conn`] is what a process's
//! workers share (the Rust client with its pools, or tuned tonic channels for
//! the `kvstore` API), opened with the [`ConnOpts`] of the run (connections,
//! transport, congestion control, retries, and the token / TLS of the
//! environment). A target that lists several addresses is a cluster's nodes:
//! `kvtier.v1` then goes through [`ClusterClient`] ([`V1Client::Cluster`]),
//! each block to a node that owns it.

use anyhow::Context;
use bytes::Bytes;
use kvtier_client::{
    Client, ClientConfig, ClusterClient, ClusterConfig, Lookup, ReadResult, WriteBlock, WriteResult,
};
use kvtier_core::Key;
use kvtier_proto::kvstore::kv_store_service_client::KvStoreServiceClient;
use tonic::transport::Channel;

use super::{Api, PREFIX_TIMEOUT, TIMEOUT, Transport};

/// A connection (pool) to the system under test, shared by a process's workers.
#[derive(Clone)]
pub enum Conn {
    /// The Rust client (its own pool of HTTP/2 connections, and of data-plane
    /// connections when used) and, for pings, tuned tonic channels.
    V1(Box<V1Client>, Vec<Channel>),
    /// Tuned tonic channels; worker i uses channel i mod n.
    KvStore(Vec<Channel>),
}

/// How to connect to kvtier.
#[derive(Debug, Clone)]
pub struct ConnOpts {
    /// API.
    pub api: Api,
    /// HTTP/2 connections.
    pub connections: usize,
    /// Read/Write transport (v1).
    pub transport: Transport,
    /// Data-plane connections (one request in flight each; 0: `connections`).
    pub data_connections: usize,
    /// Most data-plane connections one long read is striped over (1: never).
    pub read_stripes: usize,
    /// Reads of a whole long prefix (`prefix-read`): the longer deadline.
    pub long_reads: bool,
    /// Also open channels for `grpc.health.v1` pings.
    pub ping: bool,
    /// TCP congestion control of data-plane connections ("": system default).
    pub data_tcp_congestion: String,
    /// Client retries of shed requests (`None`: the client's default).
    pub retries: Option<u32>,
}

/// The `kvtier.v1` client of a run: one server's, or a cluster's through
/// its node list. Workers see the calls both have.
#[derive(Clone)]
pub enum V1Client {
    /// One address.
    One(Box<Client>),
    /// Several addresses: the nodes of a cluster.
    Cluster(ClusterClient),
}

impl V1Client {
    /// See [`Client::lookup`].
    pub async fn lookup(
        &self,
        ns: &str,
        keys: &[Key],
        lease_ms: Option<u32>,
    ) -> kvtier_client::Result<Lookup> {
        match self {
            V1Client::One(c) => c.lookup(ns, keys, lease_ms).await,
            V1Client::Cluster(c) => c.lookup(ns, keys, lease_ms).await,
        }
    }

    /// See [`Client::read`].
    pub async fn read(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
    ) -> kvtier_client::Result<ReadResult> {
        match self {
            V1Client::One(c) => c.read(ns, keys, lease_id).await,
            V1Client::Cluster(c) => c.read(ns, keys, lease_id).await,
        }
    }

    /// See [`Client::write`].
    pub async fn write(
        &self,
        ns: &str,
        blocks: &[WriteBlock],
    ) -> kvtier_client::Result<WriteResult> {
        match self {
            V1Client::One(c) => c.write(ns, blocks).await,
            V1Client::Cluster(c) => c.write(ns, blocks).await,
        }
    }

    /// See [`Client::write_tokens`].
    pub async fn write_tokens(
        &self,
        ns: &str,
        tokens: &[u32],
        payloads: &[Bytes],
    ) -> kvtier_client::Result<WriteResult> {
        match self {
            V1Client::One(c) => c.write_tokens(ns, tokens, payloads).await,
            V1Client::Cluster(c) => c.write_tokens(ns, tokens, payloads).await,
        }
    }

    /// See [`Client::keys_for`].
    pub fn keys_for(&self, tokens: &[u32]) -> Vec<Key> {
        match self {
            V1Client::One(c) => c.keys_for(tokens),
            V1Client::Cluster(c) => c.keys_for(tokens),
        }
    }

    /// The single-node clients (one, or each connected node's).
    fn clients(&self) -> Vec<Client> {
        match self {
            V1Client::One(c) => vec![c.as_ref().clone()],
            V1Client::Cluster(c) => c.node_clients().into_iter().map(|(_, c)| c).collect(),
        }
    }
}

/// The addresses of `target`: one, or a cluster's nodes (`a,b,c`).
pub fn target_addrs(target: &str) -> Vec<String> {
    kvtier_client::cluster::split_nodes(target)
}

impl Conn {
    /// Connects `connections` HTTP/2 connections to `target` (`grpc://` or
    /// `http://`), to each node when it lists several (`v1` only).
    pub async fn connect(opts: ConnOpts, target: &str) -> anyhow::Result<Self> {
        let mut addrs = target_addrs(target);
        if addrs.is_empty() {
            addrs.push(target.to_string());
        }
        anyhow::ensure!(
            addrs.len() <= 1 || opts.api == Api::V1,
            "--target lists {} addresses (a cluster's nodes): only --api v1 drives a cluster \
             (through the node list); give --api kvstore one address",
            addrs.len()
        );
        let mut cfg = ClientConfig::new(addrs[0].replacen("grpc://", "http://", 1));
        cfg.connections = opts.connections.max(1);
        cfg.timeout = if opts.long_reads {
            PREFIX_TIMEOUT
        } else {
            TIMEOUT
        };
        cfg.data_plane = opts.transport != Transport::Grpc;
        cfg.data_connections = opts.data_connections;
        cfg.read_stripes = opts.read_stripes.max(1);
        // "" (system default) is passed on as is: the client skips empty names.
        cfg.data_tcp_congestion = Some(opts.data_tcp_congestion.clone());
        if let Some(r) = opts.retries {
            cfg.retries = r;
        }
        // A server with authentication on (docs/security.md): the token comes
        // from the environment, never from the command line (it would be in
        // the record's command line).
        cfg.token = std::env::var("KVTIER_TOKEN").ok().filter(|t| !t.is_empty());
        // TLS from $KVTIER_TLS_CA (and _CERT / _KEY), like the CLI.
        cfg.tls = kvtier_client::ClientTls::from_env()?;
        Ok(match opts.api {
            Api::V1 => {
                let c = if addrs.len() > 1 {
                    let cc = ClusterConfig::with_client(addrs.clone(), cfg.clone());
                    V1Client::Cluster(ClusterClient::connect(cc).await.context("connecting")?)
                } else {
                    V1Client::One(Box::new(
                        Client::connect(cfg.clone()).await.context("connecting")?,
                    ))
                };
                anyhow::ensure!(
                    opts.transport != Transport::DataPlane
                        || c.clients().iter().all(|c| c.data_plane().is_some()),
                    "--transport data-plane: the server advertises no data plane"
                );
                let mut health = Vec::new();
                if opts.ping {
                    // Pings spread over the nodes: worker i pings channel i mod n.
                    for a in &addrs {
                        let mut hc = cfg.clone();
                        hc.endpoint =
                            ClientConfig::new(a.replacen("grpc://", "http://", 1)).endpoint;
                        health.extend(
                            kvtier_client::connect_pool(&hc)
                                .await
                                .context("connecting")?,
                        );
                    }
                }
                Conn::V1(Box::new(c), health)
            }
            Api::KvStore => Conn::KvStore(
                kvtier_client::connect_pool(&cfg)
                    .await
                    .context("connecting")?,
            ),
        })
    }

    /// Whether Read/Write go over the data plane (of every node connected).
    pub fn uses_data_plane(&self) -> bool {
        match self {
            Conn::V1(c, _) => {
                let cs = c.clients();
                !cs.is_empty() && cs.iter().all(|c| c.data_plane().is_some())
            }
            _ => false,
        }
    }

    /// The TCP data planes' addresses (one per node connected), when
    /// Read/Write use them (a same-host socket has none).
    pub fn data_plane_addrs(&self) -> Vec<std::net::SocketAddr> {
        match self {
            Conn::V1(c, _) => c
                .clients()
                .iter()
                .filter_map(|c| match c.data_plane()?.addr() {
                    kvtier_client::wire::Target::Tcp(a) => Some(*a),
                    kvtier_client::wire::Target::Unix(_) => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Owners per block when this is a cluster's node list.
    pub fn cluster_replicas(&self) -> Option<usize> {
        match self {
            Conn::V1(c, _) => match c.as_ref() {
                V1Client::Cluster(c) => Some(c.replicas()),
                V1Client::One(_) => None,
            },
            _ => None,
        }
    }
}

pub(super) fn kvstore_client(ch: Channel) -> KvStoreServiceClient<Channel> {
    KvStoreServiceClient::new(ch)
        .max_decoding_message_size(512 << 20)
        .max_encoding_message_size(512 << 20)
}

/// A `grpc.health.v1` client (the `ping` workloads).
pub(super) type HealthClient = tonic_health::pb::health_client::HealthClient<Channel>;
