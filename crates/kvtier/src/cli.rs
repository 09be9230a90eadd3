//! CLI verbs against a running server (kvtier.v1 over gRPC).
//!
//! Keys are given as hex (`--key 0a1b...`), as text (`--text-key name`), or
//! computed from tokens (`--tokens 1,2,3,...`).
use anyhow::Context as _;
use bytes::Bytes;
use clap::Args;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::{HashFn, Key};
use std::io::{Read, Write};
use std::path::PathBuf;

/// Flags every verb shares.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Server address.
    #[arg(
        long,
        short = 's',
        default_value = "http://127.0.0.1:50051",
        env = "KVTIER_SERVER"
    )]
    server: String,
    /// Deadline per call, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Bearer token, for a server with authentication on (docs/security.md).
    #[arg(long, env = "KVTIER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM CA bundle: connect over TLS, verifying the server against it.
    #[arg(long, env = "KVTIER_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for servers that verify clients (with --tls-key).
    #[arg(long, env = "KVTIER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(long, env = "KVTIER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

impl CommonArgs {
    fn tls(&self) -> anyhow::Result<Option<kvtier_client::ClientTls>> {
        let Some(ca) = self.tls_ca.as_deref().filter(|p| !p.as_os_str().is_empty()) else {
            anyhow::ensure!(self.tls_cert.is_none(), "--tls-cert needs --tls-ca");
            check_https_has_ca(&self.server, "--tls-ca FILE (or KVTIER_TLS_CA)")?;
            return Ok(None);
        };
        Ok(Some(kvtier_client::ClientTls::from_files(
            ca,
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
        )?))
    }

    fn client_config(&self) -> anyhow::Result<ClientConfig> {
        let mut cfg = ClientConfig::new(self.server.clone());
        cfg.token = self.token.clone();
        cfg.timeout = std::time::Duration::from_millis(self.timeout_ms);
        cfg.connect_timeout = cfg.timeout;
        cfg.tls = self.tls()?;
        Ok(cfg)
    }
}

/// The CLI verifies a TLS server against the CA it is given, never the
/// system's roots: an `https://` address without one is refused here rather
/// than by tonic ("Connecting to HTTPS without TLS enabled").
pub fn check_https_has_ca(server: &str, how: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !server.starts_with("https://"),
        "{server}: https:// needs {how}, the PEM CA bundle that signed the server's \
         certificate (the CLI does not use the system's roots; docs/security.md)"
    );
    Ok(())
}

/// `--key`, `--parent`, `--keys`: hex, two digits a byte; says what is wrong
/// with text that is not.
fn hex_key(flag: &str, s: &str) -> anyhow::Result<Key> {
    if let Some((i, c)) = s.chars().enumerate().find(|(_, c)| !c.is_ascii_hexdigit()) {
        anyhow::bail!(
            "{flag} {s:?} is not hex: {c:?} at position {} (hex digits are 0-9 and a-f, two a byte; \
             --text-key takes a key as text)",
            i + 1
        );
    }
    if s.len() % 2 == 1 {
        anyhow::bail!(
            "{flag} {s:?} has an odd number of hex digits ({}): each byte is two digits",
            s.len()
        );
    }
    Ok(Key::from_hex(s)?)
}

/// Stdout was closed by its reader (`kvtier stats | head -2`): `main` exits
/// quietly with status 141, as a program killed by SIGPIPE does.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `bytes` to stdout and flushes; a reader that went away is
/// [`StdoutClosed`], not a panic (Rust ignores SIGPIPE, so `println!` panics
/// on EPIPE).
pub fn print(bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes.as_ref()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        r => Ok(r?),
    }
}

/// Namespace and key selection.
#[derive(Args, Debug, Clone)]
pub struct KeyArgs {
    /// Namespace.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    /// Key as hex.
    #[arg(long, conflicts_with = "text_key")]
    key: Option<String>,
    /// Key as UTF-8 text (as used by the HTTP API).
    #[arg(long)]
    text_key: Option<String>,
}

impl KeyArgs {
    fn key(&self) -> anyhow::Result<Key> {
        match (&self.key, &self.text_key) {
            (Some(h), _) => hex_key("--key", h),
            (None, Some(t)) => Ok(Key::new(Bytes::copy_from_slice(t.as_bytes()))?),
            (None, None) => anyhow::bail!("give --key HEX or --text-key TEXT"),
        }
    }
}

/// `kvtier put`
#[derive(Args, Debug)]
pub struct PutArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Parent key as hex (for chained blocks).
    #[arg(long)]
    parent: Option<String>,
    /// File with the payload; `-` or absent reads stdin.
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// Time to live in milliseconds.
    #[arg(long, default_value_t = 0)]
    ttl_ms: u64,
}

/// `kvtier get`
#[derive(Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Write the payload here instead of stdout.
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,
}

/// `kvtier lookup`
#[derive(Args, Debug)]
pub struct LookupArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Namespace.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    /// Comma-separated token ids (keys salted with $KVTIER_KEY_SALT, if set).
    #[arg(long, value_delimiter = ',', conflicts_with = "keys")]
    tokens: Vec<u32>,
    /// Comma-separated hex keys, in chain order.
    #[arg(long, value_delimiter = ',')]
    keys: Vec<String>,
    /// Tokens per block.
    #[arg(long, default_value_t = 128)]
    block_size: usize,
    /// Hash function.
    #[arg(long, default_value = "xxh3-64-v1")]
    hash: String,
    /// Pin the found prefix for this many ms.
    #[arg(long)]
    lease_ms: Option<u32>,
}

/// `kvtier delete`
#[derive(Args, Debug)]
pub struct DeleteArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    key: KeyArgs,
}

async fn client(c: &CommonArgs) -> anyhow::Result<Client> {
    let mut cfg = c.client_config()?;
    cfg.connections = 1;
    connect(cfg, &c.server).await
}

/// `Client::connect`, its error naming `server`. A status the server sent (a
/// token refused, say) is its answer, not a failure to connect: its context
/// is the address alone.
pub async fn connect(cfg: ClientConfig, server: &str) -> anyhow::Result<Client> {
    use std::error::Error as _;
    Client::connect(cfg).await.map_err(|e| {
        let what = match &e {
            kvtier_client::ClientError::Status(s) if s.source().is_none() => server.to_string(),
            _ => format!("cannot connect to {server}"),
        };
        anyhow::Error::new(e).context(what)
    })
}

/// `kvtier put`
pub async fn put(a: PutArgs) -> anyhow::Result<()> {
    let key = a.key.key()?;
    let mut buf = Vec::new();
    match &a.file {
        Some(p) if p.as_os_str() != "-" => {
            buf = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?
        }
        _ => {
            std::io::stdin().read_to_end(&mut buf)?;
        }
    }
    let parent = a
        .parent
        .as_deref()
        .map(|p| hex_key("--parent", p))
        .transpose()?;
    let c = client(&a.common).await?;
    let block = WriteBlock {
        token_ids: Vec::new(),
        key: key.clone(),
        parent,
        token_count: 0,
        payload: buf.into(),
        ttl_ms: a.ttl_ms,
    };
    let r = c.write(&a.key.namespace, &[block]).await?;
    print(format!(
        "{} {} (server {} µs)\n",
        key.to_hex(),
        if r.stored == 1 {
            "stored"
        } else {
            "already present"
        },
        r.timing.total_us
    ))?;
    Ok(())
}

/// `kvtier get`
pub async fn get(a: GetArgs) -> anyhow::Result<()> {
    let key = a.key.key()?;
    let c = client(&a.common).await?;
    let r = c
        .read(&a.key.namespace, std::slice::from_ref(&key), 0)
        .await?;
    let Some(b) = r.blocks.into_iter().next() else {
        anyhow::bail!(
            "key {} not found in namespace {:?}",
            key.to_hex(),
            a.key.namespace
        );
    };
    match &a.out {
        Some(p) => {
            std::fs::write(p, &b.payload).with_context(|| format!("writing {}", p.display()))?
        }
        None => print(&b.payload)?,
    }
    eprintln!(
        "{} bytes from {:?} tier (server {} µs)",
        b.payload.len(),
        b.tier,
        r.timing.total_us
    );
    Ok(())
}

/// `kvtier lookup`
pub async fn lookup(a: LookupArgs) -> anyhow::Result<()> {
    let hash = HashFn::parse(&a.hash)?;
    let keys: Vec<Key> = if a.tokens.is_empty() {
        a.keys
            .iter()
            .map(|k| hex_key("--keys", k))
            .collect::<Result<_, _>>()?
    } else {
        // A tenant's secret salt (docs/keys.md) from the environment, never
        // from the command line.
        let salt = std::env::var("KVTIER_KEY_SALT").unwrap_or_default();
        hash.chain_salted(&a.tokens, a.block_size, salt.as_bytes())?
    };
    if keys.is_empty() {
        anyhow::bail!(
            "nothing to look up: {} token(s) do not fill one block of {} tokens (--block-size); \
             give at least {} --tokens, or --keys",
            a.tokens.len(),
            a.block_size,
            a.block_size
        );
    }
    let c = client(&a.common).await?;
    let r = c.lookup(&a.namespace, &keys, a.lease_ms).await?;
    let out = serde_json::json!({
        "namespace": a.namespace,
        "blocks": keys.len(),
        "found": r.found,
        "tiers": r.tiers.iter().map(|t| t.as_str_name()).collect::<Vec<_>>(),
        "keys": keys.iter().map(Key::to_hex).collect::<Vec<_>>(),
        "lease_id": r.lease_id,
        "server_us": r.timing.total_us,
        "nodes": r.nodes,
        // Per node and tier (docs/events.md, "Per-tier lookup").
        "tier_counts": r.tier_counts.iter().map(|c| serde_json::json!({
            "node": c.node,
            "tier": c.tier.as_str_name(),
            "blocks": c.blocks,
            "leading": c.leading,
        })).collect::<Vec<_>>(),
    });
    print(format!("{}\n", serde_json::to_string_pretty(&out)?))?;
    Ok(())
}

/// `kvtier delete`
pub async fn delete(a: DeleteArgs) -> anyhow::Result<()> {
    let key = a.key.key()?;
    let c = client(&a.common).await?;
    let n = c
        .delete(&a.key.namespace, std::slice::from_ref(&key))
        .await?;
    if n == 0 {
        anyhow::bail!(
            "key {} not found in namespace {:?}",
            key.to_hex(),
            a.key.namespace
        );
    }
    print(format!("deleted {n} block(s)\n"))?;
    Ok(())
}

/// `kvtier stats`
pub async fn stats(a: CommonArgs) -> anyhow::Result<()> {
    let c = client(&a).await?;
    let s = c.stats().await?;
    let tiers: Vec<_> = s
        .tiers
        .iter()
        .map(|t| {
            serde_json::json!({
                "tier": kvtier_client::Tier::try_from(t.tier).map(|x| x.as_str_name()).unwrap_or("?"),
                "blocks": t.blocks, "bytes": t.bytes, "capacity_bytes": t.capacity_bytes,
                "hits": t.hits, "misses": t.misses, "evictions": t.evictions,
            })
        })
        .collect();
    let out = serde_json::json!({ "version": s.version, "tiers": tiers, "active_leases": s.active_leases, "expired_blocks": s.expired_blocks });
    print(format!("{}\n", serde_json::to_string_pretty(&out)?))?;
    Ok(())
}

/// `kvtier health`: the standard gRPC health check (public unless
/// `auth.public_health = false`; the token is sent when given).
pub async fn health(a: CommonArgs) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let ch = kvtier_client::endpoint(&a.client_config()?)?
        .timeout(std::time::Duration::from_millis(a.timeout_ms))
        .connect()
        .await
        .with_context(|| format!("cannot connect to {}", a.server))?;
    let mut req = tonic::Request::new(HealthCheckRequest::default());
    if let Some(t) = a.token.as_deref().filter(|t| !t.is_empty()) {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse()?);
    }
    let status = HealthClient::new(ch)
        .check(req)
        .await
        .with_context(|| format!("health check of {}", a.server))?
        .into_inner()
        .status;
    let name = tonic_health::pb::health_check_response::ServingStatus::try_from(status)
        .map(|s| s.as_str_name())
        .unwrap_or("UNKNOWN");
    print(format!("{name}\n"))?;
    anyhow::ensure!(name == "SERVING", "server is {name}");
    Ok(())
}
