//! Rust client for kvtier.
//!
//! * A pool of N HTTP/2 connections (one TCP stream caps throughput; seed 003),
//!   used round-robin.
//! * Deadlines on every call (sent as `grpc-timeout`, enforced locally too).
//! * Retries of idempotent calls (all kvtier.v1 calls are idempotent) on
//!   `UNAVAILABLE` with exponential backoff and jitter, within the deadline.
//! * End-to-end checksums: CRC32C computed on write, verified on read.
//! * The key scheme, so callers can pass tokens instead of keys.
//! * Reads and writes over the fastest transport the server offers, chosen
//!   once at connect and logged ([`transport`]): the same-host socket, where
//!   payloads move through shared memory (docs/local.md), else the TCP data plane
//!   ([`wire`], docs/wire.md), else gRPC.
//! * [`ClusterClient`]: one client per node of a cluster, each block sent to
//!   a node that owns it ([`cluster`]).
//! * [`kvstore`]: a client of the seed's `kvstore.KVStoreService` API, and
//!   [`conversation`], the seed's multi-turn chat workload over it.
//!
//! Layout: `lib.rs` the `Client` and its calls; `config.rs` how it connects
//! (settings, TLS, the HTTP/2 pool, back-off); `types.rs` what calls take
//! and return.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kvtier_client::ClientError> {
//! use kvtier_client::{Client, ClientConfig};
//! let client = Client::connect(ClientConfig::new("http://127.0.0.1:50051")).await?;
//! let tokens: Vec<u32> = (0..256).collect();
//! let found = client.lookup_tokens("my-model", &tokens, None).await?;
//! println!("{} blocks cached", found.found);
//! # Ok(()) }
//! ```
pub mod cluster;
mod config;
pub mod conversation;
pub mod kvstore;
pub mod listener;
pub mod transport;
mod types;
pub mod wire;

/// [`kvstore`]'s name before docs/architecture.md's glossary settled on
/// "kvstore", kept for code outside this repository.
#[deprecated(note = "renamed to kvtier_client::kvstore")]
pub mod compat {
    pub use crate::kvstore::*;

    /// [`KvStoreClient`]'s old name.
    #[deprecated(note = "renamed to kvtier_client::kvstore::KvStoreClient")]
    pub type CompatClient = KvStoreClient;
}

use bytes::Bytes;
use futures::StreamExt;
use kvtier_core::{HashFn, Key};
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tonic::codegen::http::uri as http_uri;
use tonic::transport::{Channel, Endpoint};

pub use kvtier_proto::v1::{ServerTiming, Tier};

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// Could not connect.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The caller passed something invalid.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Data received does not match its checksum.
    #[error("corrupt data received: {0}")]
    Corrupt(String),
    /// The data plane (TCP or the same-host socket) failed below the
    /// protocol: the connection was refused, reset or closed, or a reply
    /// was malformed. No answer of the server: retried like UNAVAILABLE
    /// (its [`ClientError::code`]), never mistaken for a shed request,
    /// which the server answers with a retry hint.
    #[error("data plane {addr}: {reason}")]
    Unreachable {
        /// The address dialled.
        addr: String,
        /// What failed.
        reason: String,
    },
}

impl ClientError {
    /// The gRPC code, if the server answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status(s) => Some(s.code()),
            ClientError::Unreachable { .. } => Some(tonic::Code::Unavailable),
            _ => None,
        }
    }

    /// The pause before retry `attempt` (0-based), if this error is worth
    /// retrying: a shed request or an unavailable server (the hint it gave,
    /// see [`retry_pause`]) or a data-plane connection that failed
    /// ([`backoff`]).
    pub fn retry_pause(&self, attempt: u32) -> Option<Duration> {
        match self {
            ClientError::Status(s) if s.code() == tonic::Code::Unavailable => {
                Some(retry_pause(attempt, s))
            }
            ClientError::Unreachable { .. } => Some(backoff(attempt)),
            _ => None,
        }
    }
}

/// Result alias.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

pub use cluster::{ClusterClient, ClusterConfig};
pub use config::{
    ClientConfig, ClientTls, MAX_PUSHBACK, backoff, connect_pool, endpoint, pushback, retry_pause,
};
pub(crate) use types::to_read_block_checked;
pub use types::{Lookup, ReadBlock, ReadResult, TierCount, WriteBlock, WriteResult};
use types::{to_lookup, to_read_block};
pub use wire::{FilledBlock, ReadIntoResult};

fn grpc_client(c: Channel, max: usize) -> KvTierClient<Channel> {
    KvTierClient::new(c)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max)
}

/// A pooled kvtier.v1 client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    cfg: ClientConfig,
    /// `Bearer TOKEN`, parsed once.
    auth_header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    pool: std::sync::Arc<Vec<KvTierClient<Channel>>>,
    next: std::sync::Arc<AtomicUsize>,
    wire: Option<wire::WireClient>,
}

impl Client {
    /// Connects the pool.
    pub async fn connect(cfg: ClientConfig) -> Result<Self> {
        kvtier_core::keys::check_block_size(cfg.block_size)
            .map_err(|e| ClientError::Invalid(e.message))?;
        let max = 512 << 20;
        if transport::local_path(&cfg.endpoint).is_some() && cfg.tls.is_some() {
            return Err(ClientError::Invalid(
                "TLS is not used on the same-host socket (unix://): drop the TLS settings".into(),
            ));
        }
        let pool = connect_pool(&cfg)
            .await?
            .into_iter()
            .map(|c| grpc_client(c, max))
            .collect();
        let auth_header =
            match cfg.token.as_deref().filter(|t| !t.is_empty()) {
                Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                    ClientError::Invalid("the token must be printable ASCII".into())
                })?),
                None => None,
            };
        let mut client = Self {
            cfg,
            auth_header,
            pool: std::sync::Arc::new(pool),
            next: Default::default(),
            wire: None,
        };
        if client.cfg.data_plane {
            let stats = client.stats().await?;
            let chosen = transport::choose(&client.cfg, &stats).await?;
            if let Some(grpc) = chosen.grpc {
                client.pool =
                    std::sync::Arc::new(grpc.into_iter().map(|c| grpc_client(c, max)).collect());
            }
            client.wire = chosen.wire;
        }
        Ok(client)
    }

    /// The data-plane client, when Read/Write go over it.
    pub fn data_plane(&self) -> Option<&wire::WireClient> {
        self.wire.as_ref()
    }

    /// Retries a data-plane call on UNAVAILABLE, like gRPC calls, every
    /// attempt (`f(deadline)`) within the call's one deadline.
    async fn retry_wire<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut(Instant) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.cfg.timeout;
        let mut attempt = 0;
        loop {
            match f(deadline).await {
                Err(e) if attempt < self.cfg.retries => {
                    let Some(pause) = e.retry_pause(attempt) else {
                        return Err(e);
                    };
                    if Instant::now() + pause >= deadline {
                        // No time left to wait for: the caller's timeout holds.
                        return Err(e);
                    }
                    tracing::debug!(attempt, error = %e, "retrying");
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    fn conn(&self) -> KvTierClient<Channel> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len();
        self.pool[i].clone()
    }

    fn request<T>(&self, msg: T, deadline: Instant) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(deadline.saturating_duration_since(Instant::now()));
        if let Some(v) = &self.auth_header {
            r.metadata_mut().insert("authorization", v.clone());
        }
        r
    }

    /// Runs `f` with retries on UNAVAILABLE until the deadline.
    async fn retry<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut(KvTierClient<Channel>, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let deadline = Instant::now() + self.cfg.timeout;
        let mut attempt = 0;
        loop {
            let fut = f(self.conn(), deadline);
            let r = match tokio::time::timeout_at(deadline.into(), fut).await {
                Ok(r) => r,
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within {:?}",
                    self.cfg.timeout
                ))),
            };
            match r {
                Err(s) if s.code() == tonic::Code::Unavailable && attempt < self.cfg.retries => {
                    let pause = retry_pause(attempt, &s);
                    if Instant::now() + pause >= deadline {
                        return Err(s.into());
                    }
                    tracing::debug!(attempt, error = %s, "retrying");
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                other => return other.map_err(Into::into),
            }
        }
    }

    /// Keys of the full blocks of `tokens` under the configured scheme.
    pub fn keys_for(&self, tokens: &[u32]) -> Vec<Key> {
        self.cfg
            .hash
            .chain_salted(tokens, self.cfg.block_size, &self.cfg.salt)
            .expect("block size checked at connect")
    }

    /// How many leading `keys` are stored.
    pub async fn lookup(&self, ns: &str, keys: &[Key], lease_ms: Option<u32>) -> Result<Lookup> {
        let req = pb::LookupRequest {
            namespace: ns.to_string(),
            keys: keys.iter().map(Key::bytes).collect(),
            lease_ms: lease_ms.unwrap_or(0),
            ..Default::default()
        };
        let r = self
            .retry(|mut c, d| {
                let rq = self.request(req.clone(), d);
                async move { c.lookup(rq).await }
            })
            .await?;
        Ok(to_lookup(r.into_inner(), keys.to_vec()))
    }

    /// How many leading blocks of `tokens` are stored (keys computed client-side).
    pub async fn lookup_tokens(
        &self,
        ns: &str,
        tokens: &[u32],
        lease_ms: Option<u32>,
    ) -> Result<Lookup> {
        let keys = self.keys_for(tokens);
        self.lookup(ns, &keys, lease_ms).await
    }

    /// Reads `keys` in order; stops at the first missing block.
    pub async fn read(&self, ns: &str, keys: &[Key], lease_id: u64) -> Result<ReadResult> {
        if let Some(w) = &self.wire {
            return self.retry_wire(|d| w.read_by(ns, keys, lease_id, d)).await;
        }
        let req = pb::ReadRequest {
            namespace: ns.to_string(),
            keys: keys.iter().map(Key::bytes).collect(),
            lease_id,
        };
        self.retry(|mut c, d| {
            let rq = self.request(req.clone(), d);
            async move {
                let mut stream = c.read(rq).await?.into_inner();
                let mut out = ReadResult {
                    blocks: Vec::new(),
                    partial: false,
                    reason: String::new(),
                    timing: Default::default(),
                };
                while let Some(msg) = stream.next().await {
                    match msg?.item {
                        Some(pb::read_response::Item::Block(b)) => {
                            out.blocks.push(to_read_block(b)?)
                        }
                        Some(pb::read_response::Item::Done(d)) => {
                            out.partial = d.partial;
                            out.reason = d.reason;
                            out.timing = d.timing.unwrap_or_default();
                        }
                        None => {}
                    }
                }
                Ok(out)
            }
        })
        .await
    }

    /// Reads `keys` in order into the caller's buffers (block `i` into
    /// `dests[i]`, which must hold it), stopping at the first missing
    /// block: through shared memory on the same-host socket (docs/local.md), received
    /// into them over the TCP data plane, copied into them over gRPC.
    /// Dropping the future mid-read is safe: the buffers are written only
    /// while borrowed ([`wire::WireClient::read_into_by`]).
    pub async fn read_into(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        dests: &mut [&mut [u8]],
    ) -> Result<ReadIntoResult> {
        if let Some(w) = &self.wire {
            // retry_wire's loop, spelled out: each attempt borrows the
            // caller's buffers, which an `FnMut` closure's future cannot (and
            // an async closure would make the future not `Send`).
            let deadline = Instant::now() + self.cfg.timeout;
            let mut attempt = 0;
            loop {
                match w.read_into_by(ns, keys, lease_id, dests, deadline).await {
                    Err(e) if attempt < self.cfg.retries => match e.retry_pause(attempt) {
                        Some(pause) if Instant::now() + pause < deadline => {
                            tokio::time::sleep(pause).await;
                            attempt += 1;
                        }
                        _ => return Err(e),
                    },
                    other => return other,
                }
            }
        }
        if dests.len() != keys.len() {
            return Err(ClientError::Invalid(format!(
                "{} keys but {} buffers",
                keys.len(),
                dests.len()
            )));
        }
        let r = self.read(ns, keys, lease_id).await?;
        let mut blocks = Vec::with_capacity(r.blocks.len());
        for b in r.blocks {
            let d = &mut dests[b.index];
            if d.len() < b.payload.len() {
                return Err(ClientError::Invalid(format!(
                    "buffer {} holds {} bytes, its block {}",
                    b.index,
                    d.len(),
                    b.payload.len()
                )));
            }
            d[..b.payload.len()].copy_from_slice(&b.payload);
            blocks.push(FilledBlock {
                index: b.index,
                key: b.key,
                parent: b.parent,
                token_count: b.token_count,
                len: b.payload.len(),
                tier: b.tier,
            });
        }
        Ok(ReadIntoResult {
            blocks,
            partial: r.partial,
            reason: r.reason,
            timing: r.timing,
        })
    }

    /// Writes blocks (checksums computed here).
    pub async fn write(&self, ns: &str, blocks: &[WriteBlock]) -> Result<WriteResult> {
        if let Some(w) = &self.wire {
            return self.retry_wire(|d| w.write_by(ns, blocks, d)).await;
        }
        let req = pb::WriteRequest {
            namespace: ns.to_string(),
            blocks: blocks.iter().map(|b| b.to_pb(b.payload.clone())).collect(),
        };
        let r = self
            .retry(|mut c, d| {
                let rq = self.request(req.clone(), d);
                async move { c.write(rq).await }
            })
            .await?
            .into_inner();
        Ok(WriteResult {
            stored: r.stored,
            existing: r.existing,
            deferred: r.deferred,
            timing: r.timing.unwrap_or_default(),
        })
    }

    /// Writes one payload per full block of `tokens`, chained.
    pub async fn write_tokens(
        &self,
        ns: &str,
        tokens: &[u32],
        payloads: &[Bytes],
    ) -> Result<WriteResult> {
        let keys = self.keys_for(tokens);
        if payloads.len() != keys.len() {
            return Err(ClientError::Invalid(format!(
                "{} payloads for {} full blocks of {} tokens",
                payloads.len(),
                keys.len(),
                self.cfg.block_size
            )));
        }
        let blocks: Vec<WriteBlock> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| WriteBlock {
                token_ids: Vec::new(),
                key: k.clone(),
                parent: i.checked_sub(1).map(|p| keys[p].clone()),
                token_count: self.cfg.block_size as u32,
                payload: payloads[i].clone(),
                ttl_ms: 0,
            })
            .collect();
        self.write(ns, &blocks).await
    }

    /// Deletes blocks (and their descendants); returns how many were removed.
    pub async fn delete(&self, ns: &str, keys: &[Key]) -> Result<u32> {
        let req = pb::DeleteRequest {
            namespace: ns.to_string(),
            keys: keys.iter().map(Key::bytes).collect(),
        };
        let r = self
            .retry(|mut c, d| {
                let rq = self.request(req.clone(), d);
                async move { c.delete(rq).await }
            })
            .await?;
        Ok(r.into_inner().deleted)
    }

    /// Ends a lease early (after its blocks were read), giving its pins back.
    pub async fn release_lease(&self, lease_id: u64) -> Result<()> {
        if lease_id == 0 {
            return Err(ClientError::Invalid("lease id 0 is not a lease".into()));
        }
        let req = pb::LeaseRequest {
            release_lease_id: lease_id,
            ..Default::default()
        };
        self.retry(|mut c, d| {
            let rq = self.request(req.clone(), d);
            async move { c.lease(rq).await }
        })
        .await?;
        Ok(())
    }

    /// Server statistics.
    pub async fn stats(&self) -> Result<pb::StatsResponse> {
        let r = self
            .retry(|mut c, d| {
                let rq = self.request(pb::StatsRequest {}, d);
                async move { c.stats(rq).await }
            })
            .await?;
        Ok(r.into_inner())
    }
}
