//! Rust client for kvtier.
//!
//! * A pool of N HTTP/2 connections (one TCP stream caps throughput; seed 003),
//!   used round-robin.
//! * Deadlines on every call (sent as `grpc-timeout`, enforced locally too).
//! * Retries of idempotent calls (all kvtier.v1 calls are idempotent) on
//!   `UNAVAILABLE` with exponential backoff and jitter, within the deadline.
//! * End-to-end checksums: CRC32C computed on write, verified on read.
//! * The key scheme, so callers can pass tokens instead of keys.
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
pub mod compat;
pub mod conversation;
pub mod wire;

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
}

impl ClientError {
    /// The gRPC code, if the server answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status(s) => Some(s.code()),
            _ => None,
        }
    }
}

/// Result alias.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server URI, e.g. `http://127.0.0.1:50051`.
    pub endpoint: String,
    /// HTTP/2 connections in the pool.
    pub connections: usize,
    /// Deadline per call.
    pub timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Retries after the first attempt for idempotent calls.
    pub retries: u32,
    /// Tokens per block when computing keys from tokens.
    pub block_size: usize,
    /// Hash function for keys computed from tokens.
    pub hash: HashFn,
    /// Send Read/Write payloads over the server's bulk data plane when it
    /// advertises one (docs/wire.md); gRPC otherwise.
    pub data_plane: bool,
    /// Data-plane connections (one request in flight each); 0: `connections`.
    /// Size it to the number of concurrent callers, like a Redis client pool.
    pub data_connections: usize,
    /// TCP congestion control of data-plane connections (best effort: a name
    /// the kernel refuses leaves the system default). `None` or `""`: system default.
    /// Default: the system default, as the server's
    /// `server.data_tcp_congestion`. The client is the sender of writes, so
    /// its setting paces (or not) every write burst (notes/006-data-plane.md).
    pub data_tcp_congestion: Option<String>,
    /// Bearer token for servers that require one (`authorization: Bearer
    /// TOKEN` on gRPC, a Hello frame on the data plane; docs/security.md).
    pub token: Option<String>,
    /// TLS towards the server (gRPC and the data plane); `None`: plaintext.
    pub tls: Option<ClientTls>,
    /// Secret salt for keys computed from tokens (docs/keys.md): without it
    /// nobody can compute, and so pre-write, this tenant's keys. Never sent.
    /// Empty: unsalted.
    pub salt: Vec<u8>,
}

impl ClientConfig {
    /// Defaults for `endpoint`: 4 connections, 10 s deadline, 2 retries, 128-token blocks.
    pub fn new(endpoint: impl Into<String>) -> Self {
        let mut endpoint = endpoint.into();
        if !endpoint.contains("://") {
            endpoint = format!("http://{endpoint}");
        }
        Self {
            endpoint,
            connections: 4,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            retries: 2,
            block_size: kvtier_core::keys::DEFAULT_BLOCK_SIZE,
            hash: HashFn::default(),
            data_plane: true,
            data_connections: 0,
            data_tcp_congestion: None,
            token: None,
            tls: None,
            salt: Vec::new(),
        }
    }
}

/// Result of a lookup.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// Leading blocks present.
    pub found: usize,
    /// Tier of each found block.
    pub tiers: Vec<Tier>,
    /// The keys checked (computed client-side for token lookups).
    pub keys: Vec<Key>,
    /// Lease id (0 = none).
    pub lease_id: u64,
    /// Server timing.
    pub timing: ServerTiming,
}

/// One block to write.
#[derive(Debug, Clone)]
pub struct WriteBlock {
    /// Key.
    pub key: Key,
    /// Parent key (`None` for a chain head).
    pub parent: Option<Key>,
    /// Tokens covered.
    pub token_count: u32,
    /// Payload.
    pub payload: Bytes,
    /// TTL (0 = none).
    pub ttl_ms: u64,
}

impl WriteBlock {
    /// The wire form with the checksum of `self.payload`, carrying `payload`
    /// (the data plane sends payloads outside the message: it passes empty).
    pub(crate) fn to_pb(&self, payload: Bytes) -> pb::Block {
        pb::Block {
            key: self.key.bytes(),
            parent_key: self.parent.as_ref().map_or_else(Bytes::new, Key::bytes),
            token_count: self.token_count,
            crc32c: crc32c::crc32c(&self.payload),
            payload,
            ttl_ms: self.ttl_ms,
        }
    }
}

/// One block read.
#[derive(Debug, Clone)]
pub struct ReadBlock {
    /// Position in the request.
    pub index: usize,
    /// Key.
    pub key: Key,
    /// Parent key.
    pub parent: Option<Key>,
    /// Payload (checksum verified).
    pub payload: Bytes,
    /// Tier it was served from.
    pub tier: Tier,
}

/// Result of a read.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Blocks in request order (a prefix of the request).
    pub blocks: Vec<ReadBlock>,
    /// True when fewer than requested were returned.
    pub partial: bool,
    /// `missing`, `deadline` or empty.
    pub reason: String,
    /// Server timing.
    pub timing: ServerTiming,
}

/// Result of a write.
#[derive(Debug, Clone, Copy)]
pub struct WriteResult {
    /// Newly stored.
    pub stored: u32,
    /// Already present.
    pub existing: u32,
    /// Server timing.
    pub timing: ServerTiming,
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

/// TLS settings of a client (docs/security.md).
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// PEM CA bundle the server's certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// PEM certificate chain and key shown to servers that verify clients.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry; default: the endpoint's host.
    pub domain: Option<String>,
}

impl ClientTls {
    /// Reads the CA bundle and, when both are given, a client certificate and key.
    pub fn from_files(
        ca: &std::path::Path,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<Self> {
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| ClientError::Invalid(format!("cannot read {}: {e}", p.display())))
        };
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(ClientError::Invalid(
                    "a client certificate needs its key (and the key its certificate)".into(),
                ));
            }
        };
        Ok(Self {
            ca_pem: read(ca)?,
            identity,
            domain: None,
        })
    }

    /// From `$KVTIER_TLS_CA` (and `$KVTIER_TLS_CERT` / `$KVTIER_TLS_KEY` for a
    /// client certificate); `None` when `KVTIER_TLS_CA` is unset or empty.
    pub fn from_env() -> Result<Option<Self>> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
        let Some(ca) = var("KVTIER_TLS_CA") else {
            return Ok(None);
        };
        let (cert, key) = (var("KVTIER_TLS_CERT"), var("KVTIER_TLS_KEY"));
        Self::from_files(
            std::path::Path::new(&ca),
            cert.as_deref().map(std::path::Path::new),
            key.as_deref().map(std::path::Path::new),
        )
        .map(Some)
    }

    fn host(&self, endpoint: &str) -> String {
        if let Some(d) = &self.domain {
            return d.clone();
        }
        let rest = endpoint.split("://").nth(1).unwrap_or(endpoint);
        let authority = rest.split('/').next().unwrap_or(rest);
        match authority.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
            _ => authority,
        }
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
    }

    /// The rustls connector and server name for the data plane.
    pub fn wire(&self, endpoint: &str) -> Result<wire::WireTls> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let bad = |what: &str, e: String| ClientError::Invalid(format!("TLS {what}: {e}"));
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&self.ca_pem) {
            roots
                .add(c.map_err(|e| bad("CA bundle", e.to_string()))?)
                .map_err(|e| bad("CA bundle", e.to_string()))?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("versions", e.to_string()))?
            .with_root_certificates(roots);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| bad("client certificate", e.to_string()))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| bad("client key", e.to_string()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("client certificate", e.to_string()))?
            }
        };
        let host = self.host(endpoint);
        let server_name = ServerName::try_from(host.clone())
            .map_err(|e| bad("server name", format!("{host:?}: {e}")))?;
        Ok(wire::WireTls {
            connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
            server_name,
        })
    }

    fn grpc(&self, endpoint: &str) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut t = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(self.host(endpoint));
        if let Some((cert, key)) = &self.identity {
            t = t.identity(Identity::from_pem(cert, key));
        }
        t
    }
}

/// Builds a tuned endpoint (large HTTP/2 windows, TCP_NODELAY, keepalive),
/// over TLS when `cfg.tls` says so.
pub fn endpoint(cfg: &ClientConfig) -> Result<Endpoint> {
    let url = match (&cfg.tls, cfg.endpoint.strip_prefix("http://")) {
        (Some(_), Some(rest)) => format!("https://{rest}"),
        _ => cfg.endpoint.clone(),
    };
    let mut ep = Endpoint::from_shared(url)
        .map_err(|e| ClientError::Invalid(format!("endpoint {:?}: {e}", cfg.endpoint)))?;
    if let Some(t) = &cfg.tls {
        ep = ep
            .tls_config(t.grpc(&cfg.endpoint))
            .map_err(|e| ClientError::Invalid(format!("TLS: {e}")))?;
    }
    Ok(ep
        .connect_timeout(cfg.connect_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(32 << 20))
        .initial_connection_window_size(Some(64 << 20))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20)))
}

/// Opens `n` separate HTTP/2 connections.
pub async fn connect_pool(cfg: &ClientConfig) -> Result<Vec<Channel>> {
    let ep = endpoint(cfg)?;
    let mut chans = Vec::with_capacity(cfg.connections.max(1));
    for _ in 0..cfg.connections.max(1) {
        chans.push(ep.connect().await?);
    }
    Ok(chans)
}

/// Exponential back-off (20 ms doubling, capped) with full jitter over its
/// upper half, so clients that failed together do not retry together: the
/// pause before retry `attempt` (0-based) of a request the server shed.
pub fn backoff(attempt: u32) -> Duration {
    let base = 20u64 << attempt.min(6);
    Duration::from_millis(base / 2 + rand::random_range(0..=base / 2))
}

impl Client {
    /// Connects the pool.
    pub async fn connect(cfg: ClientConfig) -> Result<Self> {
        kvtier_core::keys::check_block_size(cfg.block_size)
            .map_err(|e| ClientError::Invalid(e.message))?;
        let max = 512 << 20;
        let pool = connect_pool(&cfg)
            .await?
            .into_iter()
            .map(|c| {
                KvTierClient::new(c)
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max)
            })
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
            let advertised = client.stats().await?.data_listen;
            if !advertised.is_empty() {
                let addr = data_plane_addr(&client.cfg.endpoint, &advertised).await?;
                let n = if client.cfg.data_connections > 0 {
                    client.cfg.data_connections
                } else {
                    client.cfg.connections
                };
                let tls = match &client.cfg.tls {
                    Some(t) => Some(t.wire(&client.cfg.endpoint)?),
                    None => None,
                };
                client.wire = Some(
                    wire::WireClient::connect_tls(
                        addr,
                        n,
                        client.cfg.timeout,
                        client.cfg.data_tcp_congestion.as_deref(),
                        client.cfg.token.as_deref(),
                        tls,
                    )
                    .await?,
                );
            }
        }
        Ok(client)
    }

    /// The data-plane client, when Read/Write go over it.
    pub fn data_plane(&self) -> Option<&wire::WireClient> {
        self.wire.as_ref()
    }

    /// Retries a data-plane call on UNAVAILABLE, like gRPC calls.
    async fn retry_wire<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        loop {
            match f().await {
                Err(e)
                    if e.code() == Some(tonic::Code::Unavailable) && attempt < self.cfg.retries =>
                {
                    tokio::time::sleep(backoff(attempt)).await;
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
                    let pause = backoff(attempt);
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
            return self.retry_wire(|| w.read(ns, keys, lease_id)).await;
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

    /// Writes blocks (checksums computed here).
    pub async fn write(&self, ns: &str, blocks: &[WriteBlock]) -> Result<WriteResult> {
        if let Some(w) = &self.wire {
            return self.retry_wire(|| w.write(ns, blocks)).await;
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

fn to_lookup(r: pb::LookupResponse, keys: Vec<Key>) -> Lookup {
    Lookup {
        found: r.found_blocks as usize,
        tiers: r
            .tiers
            .iter()
            .map(|t| Tier::try_from(*t).unwrap_or(Tier::Unspecified))
            .collect(),
        keys,
        lease_id: r.lease_id,
        timing: r.timing.unwrap_or_default(),
    }
}

/// The data-plane address to dial: the advertised one, with an unspecified IP
/// (`0.0.0.0`) replaced by the gRPC endpoint's host.
async fn data_plane_addr(endpoint: &str, advertised: &str) -> Result<std::net::SocketAddr> {
    let adv: std::net::SocketAddr = advertised.parse().map_err(|e| {
        ClientError::Invalid(format!("server advertised data plane {advertised:?}: {e}"))
    })?;
    if !adv.ip().is_unspecified() {
        return Ok(adv);
    }
    let uri: http_uri::Uri = endpoint
        .parse()
        .map_err(|e| ClientError::Invalid(format!("endpoint {endpoint:?}: {e}")))?;
    let host = uri
        .host()
        .unwrap_or("127.0.0.1")
        .trim_start_matches('[')
        .trim_end_matches(']');
    let mut addrs = tokio::net::lookup_host((host, adv.port()))
        .await
        .map_err(|e| ClientError::Invalid(format!("resolving {host}: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| ClientError::Invalid(format!("{host} resolves to no address")))
}

pub(crate) fn to_read_block(b: pb::ReadBlock) -> Result<ReadBlock, tonic::Status> {
    let actual = b
        .block
        .as_ref()
        .map_or(0, |blk| crc32c::crc32c(&blk.payload));
    to_read_block_checked(b, actual)
}

/// [`to_read_block`] for a payload whose CRC32C (`actual`) was computed while
/// it arrived.
pub(crate) fn to_read_block_checked(
    b: pb::ReadBlock,
    actual: u32,
) -> Result<ReadBlock, tonic::Status> {
    let blk = b
        .block
        .ok_or_else(|| tonic::Status::internal("server sent a ReadBlock without a block"))?;
    if actual != blk.crc32c {
        return Err(tonic::Status::data_loss(format!(
            "block {} arrived with crc32c {actual:#010x}, expected {:#010x}",
            hex(&blk.key),
            blk.crc32c
        )));
    }
    let key = Key::new(blk.key).map_err(|e| tonic::Status::internal(e.message))?;
    let parent = if blk.parent_key.is_empty() {
        None
    } else {
        Key::new(blk.parent_key).ok()
    };
    Ok(ReadBlock {
        index: b.index as usize,
        key,
        parent,
        payload: blk.payload,
        tier: Tier::try_from(b.tier).unwrap_or(Tier::Unspecified),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
