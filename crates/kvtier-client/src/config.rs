//! How a client connects: its settings, TLS material, the tuned HTTP/2
//! endpoint and connection pool, and the retry back-off.

use super::*;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server URI, e.g. `http://127.0.0.1:50051`.
    pub endpoint: String,
    /// HTTP/2 connections in the pool.
    pub connections: usize,
    /// Deadline per call.
    pub timeout: Duration,
    /// Bound on opening one connection: gRPC's TCP connect; a data-plane
    /// connection's TCP connect, TLS handshake and Hello.
    pub connect_timeout: Duration,
    /// Retries after the first attempt for idempotent calls.
    pub retries: u32,
    /// Tokens per block when computing keys from tokens.
    pub block_size: usize,
    /// Hash function for keys computed from tokens.
    pub hash: HashFn,
    /// Send Read/Write payloads over the server's bulk data plane when it
    /// advertises one (docs/wire.md) and it can be reached at connect (a
    /// warning, then gRPC, when it cannot); gRPC otherwise.
    pub data_plane: bool,
    /// Move to the server's same-host socket when it advertises one that
    /// exists here and leads back to it (docs/local.md); `false` stays on TCP.
    pub same_host: bool,
    /// Data-plane connections (one request in flight each); 0: `connections`.
    /// Size it to the number of concurrent callers, like a Redis client pool.
    pub data_connections: usize,
    /// Most data-plane connections one long read is striped over (1: never
    /// stripe). Default [`crate::wire::MAX_STRIPES`]; a read is split only
    /// when it has [`crate::wire::STRIPE_MIN_BLOCKS`] keys per stripe, and
    /// never over more connections than the pool has.
    pub read_stripes: usize,
    /// TCP congestion control of data-plane connections (best effort: a name
    /// the kernel refuses leaves the system default). `None` or `""`: system default.
    /// Default: the system default, as the server's
    /// `server.data_tcp_congestion`. The client is the sender of writes, so
    /// its setting paces (or not) every write burst (notes/006-data-plane.md).
    pub data_tcp_congestion: Option<String>,
    /// Bearer token for servers that require one (`authorization: Bearer
    /// TOKEN` on gRPC, a Hello frame on the data plane; docs/security.md).
    pub token: Option<String>,
    /// On the same-host socket: the uid the server may run as, besides this
    /// process's own and root; a socket another uid listens on is refused
    /// before anything (the token included) is sent (docs/security.md).
    /// `None`: `$KVTIER_SERVER_UID`, if set.
    pub server_uid: Option<u32>,
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
            same_host: true,
            data_connections: 0,
            read_stripes: crate::wire::MAX_STRIPES,
            data_tcp_congestion: None,
            token: None,
            server_uid: None,
            tls: None,
            salt: Vec::new(),
        }
    }
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
    let local = crate::listener::local_path(&cfg.endpoint).map(str::to_owned);
    let server_uid = crate::listener::expected_uid(cfg.server_uid)?;
    if let Some(path) = &local {
        // A clear error for the common case, before any channel exists; the
        // connector below checks every connection (reconnects included).
        if let Ok(s) = tokio::net::UnixStream::connect(path).await {
            crate::listener::check(&s, path, server_uid)?;
        }
    }
    for _ in 0..cfg.connections.max(1) {
        chans.push(match &local {
            // Each connection's listener is checked before HTTP/2 sends a byte.
            Some(path) => {
                let path = path.clone();
                ep.connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        let s = tokio::net::UnixStream::connect(&path).await?;
                        crate::listener::check(&s, &path, server_uid)
                            .map_err(std::io::Error::other)?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                    }
                }))
                .await?
            }
            None => ep.connect().await?,
        });
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

/// The longest server retry hint a client follows.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(10);

/// The server's retry hint on a shed request: `grpc-retry-pushback-ms`
/// (gRPC's retry design, A6; the data plane's error frames carry it as
/// well), at most [`MAX_PUSHBACK`]; 0 is no hint.
pub fn pushback(status: &tonic::Status) -> Option<Duration> {
    let ms: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&ms| ms > 0)?;
    Some(Duration::from_millis(ms).min(MAX_PUSHBACK))
}

/// The pause before retry `attempt` (0-based) of a request the server shed
/// with `status`: the server's hint when it gave one (it knows when its
/// limit will have moved), jittered over [hint, 1.5 × hint] so clients it
/// shed together do not come back together; [`backoff`] otherwise.
pub fn retry_pause(attempt: u32, status: &tonic::Status) -> Duration {
    match pushback(status) {
        Some(h) => h + h.mul_f64(rand::random_range(0.0..=0.5)),
        None => backoff(attempt),
    }
}

/// The data-plane address to dial: the advertised one, with an unspecified IP
/// (`0.0.0.0`) replaced by the gRPC endpoint's host.
pub(crate) async fn data_plane_addr(
    endpoint: &str,
    advertised: &str,
) -> Result<std::net::SocketAddr> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn shed(hint: Option<&str>) -> tonic::Status {
        let mut s = tonic::Status::unavailable("server overloaded");
        if let Some(h) = hint {
            s.metadata_mut()
                .insert("grpc-retry-pushback-ms", h.parse().unwrap());
        }
        s
    }

    /// A shed request is retried no sooner than the server's hint, with
    /// jitter above it; without a hint, after the client's own back-off;
    /// a hint that is not a number is ignored, and a huge one capped.
    #[test]
    fn a_retry_waits_for_the_servers_hint() {
        let ms = Duration::from_millis;
        for _ in 0..200 {
            let p = retry_pause(0, &shed(Some("200")));
            assert!(p >= ms(200) && p <= ms(300), "{p:?}");
            let p = retry_pause(0, &shed(None));
            assert!(p >= ms(10) && p <= ms(20), "{p:?}");
            let p = retry_pause(0, &shed(Some("soon")));
            assert!(p >= ms(10) && p <= ms(20), "{p:?}");
        }
        assert_eq!(pushback(&shed(Some("86400000"))), Some(MAX_PUSHBACK));
        assert_eq!(pushback(&shed(Some(" 35 "))), Some(ms(35)));
        assert_eq!(pushback(&shed(Some("0"))), None, "0: no hint");
    }
}
