//! Server configuration: TOML with typed units, unknown keys rejected,
//! validated at load. Every command-line flag of `kvtier serve` maps onto a key
//! here (see `configs/kvtier.toml` for the commented example).
use kvtier_core::{ByteSize, EngineConfig};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listening sockets and protocol limits.
    pub server: ServerSection,
    /// Storage engine and memory tier.
    pub engine: EngineSection,
    /// The local disk tier (disabled when `dir` is empty).
    pub disk: DiskSection,
    /// The seed's `kvstore.KVStoreService` API. `[compat]`, its name before
    /// docs/architecture.md's glossary settled on "kvstore", is still read
    /// (deprecated; docs/api.md).
    #[serde(alias = "compat")]
    pub kvstore: KvStoreSection,
    /// The shared object-store tier (disabled when no URL is set).
    pub object_store: ObjectStoreSection,
    /// Authentication and access control (docs/security.md).
    pub auth: AuthSection,
    /// TLS on every listener (docs/security.md); off when `cert` is empty.
    pub tls: TlsSection,
    /// Several nodes as one cache (docs/cluster.md); off unless nodes or dns is set.
    pub cluster: crate::cluster::ClusterSection,
    /// Capacity shares of the memory and disk tiers (docs/security.md).
    pub tenants: TenantsSection,
    /// KV events for cache-aware routers (docs/events.md); off unless `endpoint` is set.
    pub events: EventsSection,
}

/// `[tls]`: one certificate for the gRPC, HTTP and data-plane listeners.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// PEM certificate chain (leaf first); "" = plaintext.
    pub cert: String,
    /// PEM private key of `cert`.
    pub key: String,
    /// PEM CA bundle: when set, clients must present a certificate it signed.
    pub client_ca: String,
}

impl TlsSection {
    /// True when TLS is on.
    pub fn enabled(&self) -> bool {
        !self.cert.is_empty()
    }
}

/// `[auth]`: bearer tokens mapped to namespaces (docs/security.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// TOML file of `[[tokens]]` (token, namespaces, access); "" = no
    /// authentication. Reloaded on SIGHUP.
    pub tokens_file: String,
    /// `/metrics` without a token.
    pub public_metrics: bool,
    /// `/healthz` (and grpc.health.v1) without a token.
    pub public_health: bool,
    /// Allow listening beyond loopback without authentication.
    pub insecure: bool,
}

impl Default for AuthSection {
    fn default() -> Self {
        Self {
            tokens_file: String::new(),
            public_metrics: true,
            public_health: true,
            insecure: false,
        }
    }
}

/// `[kvstore]` (deprecated alias `[compat]`): the seed service's API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KvStoreSection {
    /// Tokens per block (the seed service uses 128).
    pub block_size: usize,
    /// Refuse tenants not listed in `tenants` (default: create on first use).
    pub strict_tenants: bool,
    /// Explicit tenant → namespace mappings.
    pub tenants: Vec<TenantMapping>,
}

impl Default for KvStoreSection {
    fn default() -> Self {
        Self {
            block_size: 128,
            strict_tenants: false,
            tenants: Vec::new(),
        }
    }
}

/// One `[[kvstore.tenants]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantMapping {
    /// `resource_name` of requests (the seed's storage account).
    pub resource_name: String,
    /// `container_name` of requests.
    pub container_name: String,
    /// kvtier namespace holding this tenant's blocks.
    pub namespace: String,
    /// This tenant's own object store (e.g. `az://its-container/kv`); blocks
    /// of `namespace` go there instead of `object_store.url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<String>,
}

/// `[server]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// gRPC listeners (`kvtier.v1` and `kvstore.KVStoreService` on each).
    /// An entry may carry a CPU set: `0.0.0.0:8085@0-47`.
    pub listen: Vec<String>,
    /// HTTP listener (`/v1/kv`, `/healthz`, `/metrics`); empty disables it.
    pub http_listen: String,
    /// Replace `listen` by one listener per NUMA node (port + node index),
    /// each pinned to that node's CPUs; uses the first `listen` address as base.
    pub numa: bool,
    /// Bulk data plane for Read/Write payloads (docs/wire.md): an address,
    /// "auto" (the first gRPC listener's host, port + 1; an ephemeral port when
    /// that listener's port is 0) or "" to disable it.
    pub data_listen: String,
    /// Same-host Unix socket (docs/local.md): gRPC and the data plane, with
    /// payloads through shared memory; "" (the default) disables it.
    pub local_listen: String,
    /// The socket file's mode, octal (default "0600": its owner only).
    pub local_mode: String,
    /// The socket file's owner, "UID" or "UID:GID"; "" keeps the server's.
    pub local_owner: String,
    /// Shared memory the same-host socket may create: every namespace's
    /// segments and the segments lent for saves together; 0 (the default)
    /// = the memory tier's capacity and an eighth more (docs/local.md).
    pub local_shared_memory: ByteSize,
    /// TCP congestion control of data-plane connections (set on the listener,
    /// inherited by every accepted connection); "" keeps the system default.
    /// Default "" (the system default), so kvtier's sockets run what every
    /// other process on the machine runs and comparisons with peers are made
    /// under equal network settings (notes/013). "reno" avoids BBR's pacing
    /// of each 1.2 MB burst on low-RTT links (notes/006-data-plane.md); the
    /// kernel must allow the name for unprivileged processes
    /// (`net.ipv4.tcp_allowed_congestion_control`; "reno" always is).
    pub data_tcp_congestion: String,
    /// How each front (gRPC, HTTP, data plane) limits the requests it
    /// serves at once: "static" (`max_inflight`, then a queue bounded by
    /// `max_queued` and `queue_timeout`) or "adaptive" (a limit that follows
    /// measured service latency, at most `max_inflight`, shedding past it
    /// without a queue; docs/operations.md, notes/012).
    pub concurrency_limit: crate::admission::Mode,
    /// Requests served at once per front (adaptive: the most the limit
    /// reaches); in static mode the rest wait in a queue (counted as queue
    /// time), bounded by `max_queued` and `queue_timeout`.
    pub max_inflight: usize,
    /// Requests that may wait for admission at once; past it requests are
    /// shed at once (UNAVAILABLE / HTTP 503, with a retry hint).
    pub max_queued: usize,
    /// The longest a request waits for admission before it is shed.
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Duration,
    /// Largest gRPC message accepted (a Write batch is one message).
    pub max_message_size: ByteSize,
    /// HTTP/2 per-stream flow-control window.
    pub stream_window: ByteSize,
    /// HTTP/2 per-connection flow-control window.
    pub connection_window: ByteSize,
    /// HTTP/2 keepalive ping interval.
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// How long in-flight requests may take to finish on shutdown.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Bytes of requests being received and not yet stored, all fronts
    /// together (docs/operations.md); a request that would pass it is refused
    /// with RESOURCE_EXHAUSTED before its body is read. 0 = a quarter of the
    /// memory tier, at least 64 MiB.
    pub request_memory: ByteSize,
    /// The line for the process's RSS: from 32 MiB below it freed pages go
    /// back to the kernel (docs/operations.md, notes/024, notes/033).
    /// 0 = the memory tier + 10 % + `request_memory` + 64 MiB.
    pub resident_limit: ByteSize,
    /// Open connections per listener (gRPC, HTTP, data plane). A new one
    /// past it takes the slot of the oldest idle one; only when every one is
    /// busy is it closed at accept (docs/operations.md, "Connection floods").
    pub max_connections: usize,
    /// Open connections per client address and listener, bounded the same way.
    pub max_connections_per_client: usize,
    /// An HTTP request's head, and the rest of a data-plane frame header
    /// once its first byte arrived, must arrive within this (slowloris).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Requests in flight at once on one gRPC (HTTP/2) connection: the
    /// SETTINGS_MAX_CONCURRENT_STREAMS the server announces; clients queue
    /// past it. Data-plane and HTTP/1.1 connections serve one request at a
    /// time.
    pub max_streams_per_connection: u32,
    /// A connection (any listener) with no request in service for this long
    /// is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Once a request's first byte arrived, all of it must arrive within this.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    /// A reply the client takes no byte of for this long is dropped (and a
    /// data-plane connection closed): docs/operations.md.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Bytes of data-plane replies not yet taken by their clients, all
    /// together (docs/operations.md); 0 = as much as `request_memory`.
    pub reply_memory: ByteSize,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: vec!["127.0.0.1:50051".into()],
            numa: false,
            http_listen: "127.0.0.1:8080".into(),
            data_listen: "auto".into(),
            local_listen: String::new(),
            local_mode: "0600".into(),
            local_owner: String::new(),
            local_shared_memory: ByteSize(0),
            data_tcp_congestion: String::new(),
            concurrency_limit: crate::admission::Mode::Static,
            max_inflight: 1024,
            max_queued: 1024,
            queue_timeout: Duration::from_secs(1),
            max_message_size: ByteSize::mib(256),
            stream_window: ByteSize::mib(32),
            connection_window: ByteSize::mib(64),
            keepalive_interval: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            request_memory: ByteSize(0),
            resident_limit: ByteSize(0),
            max_connections: 4096,
            max_connections_per_client: 1024,
            header_timeout: Duration::from_secs(5),
            max_streams_per_connection: 256,
            idle_timeout: Duration::from_secs(300),
            read_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
            reply_memory: ByteSize(0),
        }
    }
}

/// `[engine]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    /// Memory-tier byte budget.
    pub memory_capacity: ByteSize,
    /// Largest block / value payload.
    pub max_block_size: ByteSize,
    /// Tokens per block when a request does not say.
    pub block_size: usize,
    /// Longest lease granted.
    #[serde(with = "humantime_serde")]
    pub max_lease: Duration,
    /// Bytes all leases together may pin; 0 = half of `memory_capacity`.
    pub max_pinned: ByteSize,
    /// Bytes one namespace's leases may pin; 0 = `max_pinned`.
    pub max_pinned_per_namespace: ByteSize,
}

impl Default for EngineSection {
    fn default() -> Self {
        let e = EngineConfig::default();
        Self {
            memory_capacity: e.memory_capacity,
            max_block_size: e.max_block_size,
            block_size: e.default_block_size,
            max_lease: e.max_lease,
            max_pinned: e.max_pinned,
            max_pinned_per_namespace: e.max_pinned_per_namespace,
        }
    }
}

impl EngineSection {
    /// The engine's view of this section.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            memory_capacity: self.memory_capacity,
            max_block_size: self.max_block_size,
            default_block_size: self.block_size,
            max_lease: self.max_lease,
            max_pinned: self.max_pinned,
            max_pinned_per_namespace: self.max_pinned_per_namespace,
            ..EngineConfig::default()
        }
    }
}

pub use crate::numa::ListenSpec;
pub use compression::CompressionNamespace;
pub use kv_events::EventsSection;
pub use listen::SameHostSocket;
pub use tenants::{ShareEntry, TenantsSection};
pub use tiers::{DiskSection, NamespaceStore, ObjectStoreSection};

mod compression;
mod kv_events;
mod listen;
mod tenants;
mod tiers;

impl Config {
    /// Reads and validates a TOML file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let cfg: Config = toml::from_str(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The effective configuration as TOML (for `--print-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }

    /// Checks cross-field constraints.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.cluster.validate()?;
        self.tenants.validate()?;
        self.events.validate()?;
        anyhow::ensure!(
            !self.cluster.enabled() || self.events.node.is_empty(),
            "events.node is for a single node: in a cluster each node is named by its \
             cluster.self, in events and in lookups alike (docs/events.md)"
        );
        if self.tls.cert.is_empty() != self.tls.key.is_empty() {
            anyhow::bail!("tls: cert and key go together (both set, or both empty)");
        }
        if !self.tls.client_ca.is_empty() && !self.tls.enabled() {
            anyhow::bail!("tls.client_ca needs tls.cert and tls.key");
        }
        if self.server.listen.is_empty() {
            anyhow::bail!("server.listen: at least one gRPC listener is required");
        }
        for l in &self.server.listen {
            let cpus = ListenSpec::parse(l)?.cpus.unwrap_or_default();
            crate::numa::check_allowed(&cpus)
                .map_err(|e| anyhow::anyhow!("server.listen {l:?}: {e}"))?;
        }
        anyhow::ensure!(
            !(self.cluster.enabled() && self.tls.enabled()),
            "[cluster] with [tls] is not supported yet: nodes call each other in plaintext \
             gRPC and a TLS listener refuses them, so nothing would be replicated \
             (docs/cluster.md, \"Not done yet\"); run the cluster on a private network without [tls]"
        );
        if !self.server.http_listen.is_empty() {
            self.server.http_listen.parse::<SocketAddr>().map_err(|e| {
                anyhow::anyhow!("server.http_listen {:?}: {e}", self.server.http_listen)
            })?;
        }
        self.data_listen()?;
        self.same_host_socket()?;
        let cc = &self.server.data_tcp_congestion;
        if cc.len() > 15 || !cc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            anyhow::bail!(
                "server.data_tcp_congestion {cc:?}: expected a congestion control name such as \"reno\", \"cubic\" or \"bbr\" (or \"\" for the system default)"
            );
        }
        if self.server.max_inflight == 0 {
            anyhow::bail!("server.max_inflight must be > 0");
        }
        if self.server.max_streams_per_connection == 0 {
            anyhow::bail!("server.max_streams_per_connection must be > 0");
        }
        if self.server.idle_timeout.is_zero()
            || self.server.read_timeout.is_zero()
            || self.server.header_timeout.is_zero()
            || self.server.write_timeout.is_zero()
        {
            anyhow::bail!(
                "server.idle_timeout, read_timeout, header_timeout and write_timeout must be > 0 (a zero timeout would close every connection between requests)"
            );
        }
        let e = &self.engine;
        if e.max_block_size.bytes() == 0 {
            anyhow::bail!("engine.max_block_size must be > 0");
        }
        if self.server.max_message_size.bytes() > u64::from(u32::MAX) {
            anyhow::bail!(
                "server.max_message_size ({}) must be below 4 GiB: data-plane frames carry a 32-bit length",
                self.server.max_message_size
            );
        }
        if self.server.max_message_size < e.max_block_size {
            anyhow::bail!(
                "server.max_message_size ({}) must be at least engine.max_block_size ({})",
                self.server.max_message_size,
                e.max_block_size
            );
        }
        self.disk.policy()?;
        self.disk.admission()?;
        if !self.disk.dir.is_empty() && self.disk.capacity < e.max_block_size {
            anyhow::bail!(
                "disk.capacity ({}) is smaller than engine.max_block_size ({})",
                self.disk.capacity,
                e.max_block_size
            );
        }
        kvtier_core::keys::check_block_size(self.kvstore.block_size)
            .map_err(|x| anyhow::anyhow!("kvstore.block_size: {x}"))?;
        for t in &self.kvstore.tenants {
            kvtier_core::Namespace::new(&t.namespace).map_err(|x| {
                anyhow::anyhow!(
                    "kvstore.tenants ({}, {}): {x}",
                    t.resource_name,
                    t.container_name
                )
            })?;
        }
        kvtier_core::keys::check_block_size(e.block_size)
            .map_err(|x| anyhow::anyhow!("engine.block_size: {x}"))?;
        self.object_store.policy()?;
        self.object_store.admission()?;
        self.object_store.codecs()?;
        for n in &self.object_store.namespaces {
            kvtier_core::Namespace::new(&n.namespace)
                .map_err(|x| anyhow::anyhow!("object_store.namespaces {:?}: {x}", n.namespace))?;
        }
        let o = &self.object_store;
        if o.queue_capacity == 0 || o.upload_concurrency == 0 || o.read_ahead == 0 {
            anyhow::bail!(
                "object_store.queue_capacity, object_store.upload_concurrency and \
                 object_store.read_ahead must be > 0"
            );
        }
        let min = ByteSize(e.max_block_size.bytes().min(1 << 20));
        if e.memory_capacity.bytes() < min.bytes() {
            let why = "engine.max_block_size, at most 1MiB";
            anyhow::bail!(
                "engine.memory_capacity ({}) is too small: the minimum is {min} ({why})",
                e.memory_capacity
            );
        }
        Ok(())
    }

    /// `server.request_memory`, with 0 resolved to its derived default.
    pub fn request_memory(&self) -> u64 {
        match self.server.request_memory.bytes() {
            0 => (self.engine.memory_capacity.bytes() / 4).max(64 << 20),
            n => n,
        }
    }

    /// `server.resident_limit`, with 0 resolved to its derived default.
    pub fn resident_limit(&self) -> u64 {
        match self.server.resident_limit.bytes() {
            0 => self.engine.memory_capacity.bytes() / 10 * 11 + self.request_memory() + (64 << 20),
            n => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_roundtrip_through_toml() {
        let c = Config::default();
        let text = c.to_toml();
        assert_eq!(Config::parse(&text).unwrap(), c);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Config::parse("[engine]\nmemory_capacityy = \"1GiB\"\n").unwrap_err();
        assert!(err.to_string().contains("memory_capacityy"), "{err}");
    }

    #[test]
    fn units_and_validation() {
        let c =
            Config::parse("[engine]\nmemory_capacity = \"512MiB\"\nmax_lease = \"5s\"\n").unwrap();
        assert_eq!(c.engine.memory_capacity, ByteSize::mib(512));
        assert_eq!(c.engine.max_lease, Duration::from_secs(5));
        assert!(Config::parse("[engine]\nblock_size = 0\n").is_err());
        assert!(Config::parse("[server]\nlisten = [\"nope\"]\n").is_err());
        for ok in ["reno", "cubic", "bbr", ""] {
            let c = Config::parse(&format!("[server]\ndata_tcp_congestion = \"{ok}\"\n")).unwrap();
            assert_eq!(c.server.data_tcp_congestion, ok);
        }
        for bad in ["reno; x", "a-very-long-congestion-name", "bbr\\u0000"] {
            let e = Config::parse(&format!("[server]\ndata_tcp_congestion = \"{bad}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("data_tcp_congestion"), "{e}");
        }
        // Data-plane frames carry 32-bit lengths.
        let e = Config::parse("[server]\nmax_message_size = \"4GiB\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("below 4 GiB"), "{e}");
        assert!(Config::parse("[server]\nmax_message_size = \"3GiB\"\n").is_ok());
        for bad in [
            "max_streams_per_connection = 0",
            "idle_timeout = \"0s\"",
            "read_timeout = \"0s\"",
            "write_timeout = \"0s\"",
        ] {
            let e = Config::parse(&format!("[server]\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("must be > 0"), "{bad}: {e}");
        }
    }

    #[test]
    fn example_config_is_valid_and_matches_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/kvtier.toml");
        let c = Config::load(Path::new(path)).unwrap();
        assert_eq!(c.server, Config::default().server);
        assert_eq!(c.engine, Config::default().engine);
        assert_eq!(c.disk, Config::default().disk);
        assert_eq!(c.object_store, Config::default().object_store);
        assert_eq!(c.cluster, Config::default().cluster);
        assert_eq!(c.tenants, Config::default().tenants);
        assert_eq!(c.events, Config::default().events);
    }

    #[test]
    fn kvstore_section_reads_its_deprecated_name_compat_too() {
        let body = "block_size = 64\nstrict_tenants = true\n";
        let tenant = "resource_name = \"r\"\ncontainer_name = \"c\"\nnamespace = \"t\"\n";
        let new =
            Config::parse(&format!("[kvstore]\n{body}[[kvstore.tenants]]\n{tenant}")).unwrap();
        let old = Config::parse(&format!("[compat]\n{body}[[compat.tenants]]\n{tenant}")).unwrap();
        assert_eq!(new.kvstore.block_size, 64);
        assert!(new.kvstore.strict_tenants);
        assert_eq!(new.kvstore.tenants[0].namespace, "t");
        assert_eq!(old, new);
        assert_ne!(new.kvstore, KvStoreSection::default());
        // Written out (--print-config) under the new name only.
        let printed = old.to_toml();
        assert!(
            printed.contains("[kvstore]") && !printed.contains("compat"),
            "{printed}"
        );
        // Validation names the section by its new name, whichever was written.
        let e = Config::parse("[compat]\nblock_size = 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("kvstore.block_size"), "{e}");
        // Both names at once is one section given twice.
        let e = Config::parse("[kvstore]\nblock_size = 64\n[compat]\nblock_size = 64\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn object_store_section_and_tenant_stores() {
        let c = Config::parse(
            "[object_store]\nurl = \"s3://b/p\"\nwrite_policy = \"write-through\"\n\
             [[object_store.namespaces]]\nnamespace = \"n1\"\nurl = \"az://c/x\"\n\
             [[kvstore.tenants]]\nresource_name = \"r\"\ncontainer_name = \"c\"\nnamespace = \"t\"\nobject_store = \"az://t/kv\"\n",
        )
        .unwrap();
        assert_eq!(
            c.object_store.policy().unwrap(),
            kvtier_core::ObjectWritePolicy::WriteThrough
        );
        let tc = crate::object::tier_config(&c).unwrap().unwrap();
        assert_eq!(
            tc.namespaces,
            vec![
                ("n1".into(), "az://c/x".into()),
                ("t".into(), "az://t/kv".into())
            ]
        );
        assert!(Config::parse("[object_store]\nwrite_policy = \"sometimes\"\n").is_err());
        assert!(Config::parse("[object_store]\nurll = \"x\"\n").is_err());
        assert!(
            crate::object::tier_config(&Config::default())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_cluster_with_tls_is_refused() {
        let tls = "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n";
        let cluster =
            "[cluster]\nself = \"grpc://a:1\"\nnodes = [\"grpc://a:1\", \"grpc://b:1\"]\n";
        let e = Config::parse(&format!("{tls}{cluster}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[cluster] with [tls] is not supported"), "{e}");
        assert!(Config::parse(tls).is_ok());
        assert!(Config::parse(cluster).is_ok());
    }

    #[test]
    fn memory_capacity_below_the_minimum_names_it() {
        let e = Config::parse("[engine]\nmemory_capacity = \"1KiB\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("too small") && e.contains("the minimum is 1MiB"),
            "{e}"
        );
    }

    #[test]
    fn listen_cpuset_outside_the_allowed_cpus_is_refused() {
        let allowed = crate::numa::current_affinity().unwrap();
        let outside = (0..).find(|c| !allowed.contains(c)).unwrap();
        let text = |cpus: &str| format!("[server]\nlisten = [\"127.0.0.1:0@{cpus}\"]\n");
        let e = Config::parse(&text(&format!("{}-{outside}", allowed[0])))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("CPU {outside} ")) && e.contains("may use"),
            "{e}"
        );
        assert!(Config::parse(&text(&allowed[0].to_string())).is_ok());
    }

    #[test]
    fn listen_specs_with_cpusets() {
        let l = ListenSpec::parse("0.0.0.0:8085@0-3,8").unwrap();
        assert_eq!(l.cpus, Some(vec![0, 1, 2, 3, 8]));
        assert!(ListenSpec::parse("0.0.0.0:8085@3-1").is_err());
        assert_eq!(ListenSpec::parse("127.0.0.1:1").unwrap().cpus, None);
    }
}
