//! Connecting to the system under test: a [`Conn`] is what a process's
//! workers share (the Rust client with its pools, or tuned tonic channels for
//! the `kvstore` API), opened with the [`ConnOpts`] of the run (connections,
//! transport, congestion control, retries, and the token / TLS of the
//! environment).

use anyhow::Context;
use kvtier_client::{Client, ClientConfig};
use kvtier_proto::kvstore::kv_store_service_client::KvStoreServiceClient;
use tonic::transport::Channel;

use super::{Api, PREFIX_TIMEOUT, TIMEOUT, Transport};

/// A connection (pool) to the system under test, shared by a process's workers.
#[derive(Clone)]
pub enum Conn {
    /// The Rust client (its own pool of HTTP/2 connections, and of data-plane
    /// connections when used) and, for pings, tuned tonic channels.
    V1(Box<Client>, Vec<Channel>),
    /// Tuned tonic channels; worker i uses channel i mod n.
    Compat(Vec<Channel>),
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

impl Conn {
    /// Connects `connections` HTTP/2 connections to `target` (`grpc://` or `http://`).
    pub async fn connect(opts: ConnOpts, target: &str) -> anyhow::Result<Self> {
        let ep = target.replacen("grpc://", "http://", 1);
        let mut cfg = ClientConfig::new(ep);
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
                let c = Client::connect(cfg.clone()).await.context("connecting")?;
                anyhow::ensure!(
                    opts.transport != Transport::DataPlane || c.data_plane().is_some(),
                    "--transport data-plane: the server advertises no data plane"
                );
                let health = if opts.ping {
                    kvtier_client::connect_pool(&cfg)
                        .await
                        .context("connecting")?
                } else {
                    Vec::new()
                };
                Conn::V1(Box::new(c), health)
            }
            Api::Compat => Conn::Compat(
                kvtier_client::connect_pool(&cfg)
                    .await
                    .context("connecting")?,
            ),
        })
    }

    /// Whether Read/Write go over the data plane.
    pub fn uses_data_plane(&self) -> bool {
        matches!(self, Conn::V1(c, _) if c.data_plane().is_some())
    }

    /// The data plane's address, when Read/Write use it.
    pub fn data_plane_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Conn::V1(c, _) => c.data_plane().map(|w| w.addr()),
            _ => None,
        }
    }
}

pub(super) fn compat_client(ch: Channel) -> KvStoreServiceClient<Channel> {
    KvStoreServiceClient::new(ch)
        .max_decoding_message_size(512 << 20)
        .max_encoding_message_size(512 << 20)
}

/// A `grpc.health.v1` client (the `ping` workloads).
pub(super) type HealthClient = tonic_health::pb::health_client::HealthClient<Channel>;
