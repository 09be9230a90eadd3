//! `kvtier serve`: flags override the config file, which overrides defaults.
use clap::Args;
use kvtier_core::ByteSize;
use kvtier_server::Server;
use kvtier_server::config::Config;
use std::path::PathBuf;

/// Flags of `kvtier serve`. Each maps onto a config key (shown in brackets).
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// TOML config file; flags given here override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// gRPC listen address, repeatable; `ADDR@CPUSET` pins [server.listen, default 127.0.0.1:50051].
    #[arg(long = "listen")]
    listen: Vec<String>,
    /// Bulk data-plane address, "auto" (gRPC port + 1) or "" to disable [server.data_listen, default auto].
    #[arg(long)]
    data_listen: Option<String>,
    /// Same-host Unix socket path (gRPC + data plane, payloads through shared memory; docs/local.md) [server.local_listen, default "" (off)].
    #[arg(long, value_name = "PATH")]
    local_listen: Option<String>,
    /// TCP congestion control of data-plane connections, "" = system default [server.data_tcp_congestion, default: the system default].
    #[arg(long)]
    data_tcp_congestion: Option<String>,
    /// One gRPC listener per NUMA node (port + node), pinned to its CPUs [server.numa, default false].
    #[arg(long)]
    numa: bool,
    /// HTTP listen address; "" disables HTTP [server.http_listen, default 127.0.0.1:8080].
    #[arg(long)]
    http_listen: Option<String>,
    /// Memory-tier budget [engine.memory_capacity, default 2GiB].
    #[arg(long)]
    memory_capacity: Option<ByteSize>,
    /// Largest block/value payload [engine.max_block_size, default 64MiB].
    #[arg(long)]
    max_block_size: Option<ByteSize>,
    /// Default tokens per block [engine.block_size, default 128].
    #[arg(long)]
    block_size: Option<usize>,
    /// Requests served at once per front [server.max_inflight, default 1024].
    #[arg(long)]
    max_inflight: Option<usize>,
    /// static | adaptive: how each front limits requests in service; adaptive
    /// sheds at the latency knee [server.concurrency_limit, default static].
    #[arg(long)]
    concurrency_limit: Option<kvtier_server::admission::Mode>,
    /// Largest gRPC message [server.max_message_size, default 256MiB].
    #[arg(long)]
    max_message_size: Option<ByteSize>,
    /// Disk-tier directory; enables the disk tier [disk.dir, default "" (no disk tier)].
    #[arg(long)]
    disk_dir: Option<String>,
    /// Disk-tier budget [disk.capacity, default 10GiB].
    #[arg(long)]
    disk_capacity: Option<ByteSize>,
    /// When the disk tier fsyncs: always | batch | never [disk.sync, default always].
    #[arg(long)]
    disk_sync: Option<kvtier_core::SyncMode>,
    /// write-through | write-back [disk.write_policy, default write-through].
    #[arg(long)]
    write_policy: Option<String>,
    /// Which blocks go to disk: all | reuse | tinylfu [disk.admission, default all].
    #[arg(long)]
    disk_admission: Option<String>,
    /// Shared object store: az://container/prefix, s3://bucket/prefix,
    /// file:///dir; credentials and endpoints from AZURE_* / AWS_* [object_store.url, default "" (none)].
    #[arg(long)]
    object_store: Option<String>,
    /// write-back | write-through towards the object store [object_store.write_policy, default write-back].
    #[arg(long)]
    object_write_policy: Option<String>,
    /// Which blocks are uploaded: all | reuse | tinylfu [object_store.admission, default all].
    #[arg(long)]
    object_admission: Option<String>,
    /// Tokens file (`[[tokens]]` token / namespaces / access); turns
    /// authentication on, reloaded on SIGHUP [auth.tokens_file, default "" (no authentication)].
    #[arg(long)]
    auth_tokens: Option<String>,
    /// Allow listening beyond loopback without authentication [auth.insecure, default false].
    #[arg(long)]
    insecure: bool,
    /// PEM certificate chain; turns TLS on for gRPC, HTTP and the data plane [tls.cert, default "" (plaintext)].
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<String>,
    /// PEM private key of --tls-cert [tls.key, default ""].
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<String>,
    /// PEM CA bundle; clients must then present a certificate it signed [tls.client_ca, default "" (no client certificates)].
    #[arg(long)]
    tls_client_ca: Option<String>,
    /// Every node of the cluster, comma-separated `grpc://host:port`, this
    /// one included (docs/cluster.md); none: a single node [cluster.nodes].
    #[arg(long, value_delimiter = ',', env = "KVTIER_CLUSTER_NODES")]
    cluster_nodes: Vec<String>,
    /// This node as the others reach it, `grpc://host:port` [cluster.self].
    #[arg(long, env = "KVTIER_CLUSTER_SELF")]
    cluster_self: Option<String>,
    /// Nodes holding each block in memory/disk [cluster.replicas, default 2].
    #[arg(long, env = "KVTIER_CLUSTER_REPLICAS")]
    cluster_replicas: Option<usize>,
    /// `name:port` whose addresses are the nodes, instead of --cluster-nodes [cluster.dns].
    #[arg(long, env = "KVTIER_CLUSTER_DNS")]
    cluster_dns: Option<String>,
    /// Publish KV events in vLLM's format on a ZMQ PUB socket bound here,
    /// `tcp://HOST:PORT` (loopback unless events.insecure_remote) or
    /// `ipc://PATH` (docs/events.md) [events.endpoint, default "" (off)].
    #[arg(long, env = "KVTIER_KV_EVENTS")]
    kv_events: Option<String>,
    /// ZMQ ROUTER endpoint answering replay requests as vLLM's publisher
    /// does [events.replay_endpoint, default "" (none)].
    #[arg(long, env = "KVTIER_KV_EVENTS_REPLAY")]
    kv_events_replay: Option<String>,
    /// This node's name in events' topics `kv@NODE@NAMESPACE` and in
    /// lookups [events.node, default: --cluster-self, else the first --listen].
    #[arg(long, env = "KVTIER_KV_EVENTS_NODE")]
    kv_events_node: Option<String>,
    /// Print the bound addresses as one JSON line on stdout once listening.
    #[arg(long)]
    ready_json: bool,
}

impl ServeArgs {
    fn config(&self) -> anyhow::Result<Config> {
        let mut cfg = match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        if !self.listen.is_empty() {
            cfg.server.listen = self.listen.clone();
        }
        if self.numa {
            cfg.server.numa = true;
        }
        if let Some(v) = &self.data_listen {
            cfg.server.data_listen = v.clone();
        }
        if let Some(v) = &self.local_listen {
            cfg.server.local_listen = v.clone();
        }
        if let Some(v) = &self.data_tcp_congestion {
            cfg.server.data_tcp_congestion = v.clone();
        }
        if let Some(v) = &self.http_listen {
            cfg.server.http_listen = v.clone();
        }
        if let Some(v) = self.memory_capacity {
            cfg.engine.memory_capacity = v;
        }
        if let Some(v) = self.max_block_size {
            cfg.engine.max_block_size = v;
        }
        if let Some(v) = self.block_size {
            cfg.engine.block_size = v;
        }
        if let Some(v) = self.max_inflight {
            cfg.server.max_inflight = v;
        }
        if let Some(v) = self.concurrency_limit {
            cfg.server.concurrency_limit = v;
        }
        if let Some(v) = self.max_message_size {
            cfg.server.max_message_size = v;
        }
        if let Some(v) = &self.disk_dir {
            cfg.disk.dir = v.clone();
        }
        if let Some(v) = self.disk_capacity {
            cfg.disk.capacity = v;
        }
        if let Some(v) = self.disk_sync {
            cfg.disk.sync = v;
        }
        if let Some(v) = &self.write_policy {
            cfg.disk.write_policy = v.clone();
        }
        if let Some(v) = &self.object_store {
            cfg.object_store.url = v.clone();
        }
        if let Some(v) = &self.object_write_policy {
            cfg.object_store.write_policy = v.clone();
        }
        if let Some(v) = &self.disk_admission {
            cfg.disk.admission = v.clone();
        }
        if let Some(v) = &self.object_admission {
            cfg.object_store.admission = v.clone();
        }
        if let Some(v) = &self.auth_tokens {
            cfg.auth.tokens_file = v.clone();
        }
        if self.insecure {
            cfg.auth.insecure = true;
        }
        if let Some(v) = &self.tls_cert {
            cfg.tls.cert = v.clone();
        }
        if let Some(v) = &self.tls_key {
            cfg.tls.key = v.clone();
        }
        if let Some(v) = &self.tls_client_ca {
            cfg.tls.client_ca = v.clone();
        }
        if !self.cluster_nodes.is_empty() {
            cfg.cluster.nodes = self.cluster_nodes.clone();
        }
        if let Some(v) = &self.cluster_self {
            cfg.cluster.self_ = v.clone();
        }
        if let Some(v) = self.cluster_replicas {
            cfg.cluster.replicas = v;
        }
        if let Some(v) = &self.cluster_dns {
            cfg.cluster.dns = v.clone();
        }
        if let Some(v) = &self.kv_events {
            cfg.events.endpoint = v.clone();
        }
        if let Some(v) = &self.kv_events_replay {
            cfg.events.replay_endpoint = v.clone();
        }
        if let Some(v) = &self.kv_events_node {
            cfg.events.node = v.clone();
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Runs the server until SIGINT / SIGTERM, then shuts down gracefully.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = args.config()?;
    if args.print_config {
        return crate::cli::print(cfg.to_toml());
    }
    check_disk_space(&cfg);
    // Handlers first: a SIGTERM right after the ready line must still be a
    // graceful shutdown, not the default action (kill).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut server = Server::start(cfg.clone()).await?;
    #[cfg(feature = "jemalloc")]
    crate::purge::start(cfg.resident_limit())?;
    describe(&cfg, &server);
    if args.ready_json {
        let grpc: Vec<String> = server.grpc_addrs.iter().map(|a| a.to_string()).collect();
        println!(
            "{}",
            serde_json::json!({
                "grpc": grpc,
                "http": server.http_addr.map(|a| a.to_string()),
                "data": server.data_addr.map(|a| a.to_string()),
                "pid": std::process::id(),
            })
        );
    }
    loop {
        tokio::select! {
            _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = hup.recv() => {
                match server.auth.reload() {
                    Ok(_) if !server.auth.enabled() => tracing::info!("SIGHUP: authentication is off (no auth.tokens_file); nothing to reload"),
                    Ok(n) => tracing::info!(tokens = n, "SIGHUP: tokens reloaded"),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: tokens not reloaded; the previous ones stay in force"),
                }
                if let Some(tls) = &server.tls {
                    match tls.reload() {
                        Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and client CA reloaded; new connections use them"),
                        Err(e) => tracing::error!(error = format!("{e:#}"), "SIGHUP: TLS not reloaded; the previous certificate stays in service"),
                    }
                }
            }
            r = server.wait() => { r?; anyhow::bail!("a listener stopped unexpectedly"); }
        }
    }
    server.shutdown().await?;
    tracing::info!("stopped");
    Ok(())
}

/// One start-up summary an operator can read: what listens where and which
/// tiers hold the data.
fn describe(cfg: &Config, server: &Server) {
    let grpc: Vec<String> = server.grpc_addrs.iter().map(|a| a.to_string()).collect();
    let http = server.http_addr.map_or("off".to_string(), |a| {
        format!("{a} (/v1/kv, /healthz, /metrics)")
    });
    let data = server
        .data_addr
        .map_or("off".to_string(), |a| a.to_string());
    tracing::info!(
        "kvtier {} listening: gRPC {} (kvtier.v1, kvstore.KVStoreService, health, reflection); data plane {}; HTTP {}",
        env!("CARGO_PKG_VERSION"),
        grpc.join(", "),
        data,
        http
    );
    let mut tiers = vec![format!("memory {}", cfg.engine.memory_capacity)];
    if cfg.disk.dir.is_empty() {
        tiers.push("no disk tier (--disk-dir to add one)".into());
    } else {
        tiers.push(format!(
            "disk {} at {} (sync {:?}, {})",
            cfg.disk.capacity, cfg.disk.dir, cfg.disk.sync, cfg.disk.write_policy
        ));
    }
    if cfg.object_store.url.is_empty() {
        tiers.push("no object store (--object-store to add one)".into());
    } else {
        tiers.push(format!(
            "object store {} ({})",
            cfg.object_store.url, cfg.object_store.write_policy
        ));
    }
    tracing::info!("tiers: {}", tiers.join(" -> "));
    if server.auth.enabled() {
        tracing::info!(
            tokens_file = %cfg.auth.tokens_file,
            public_metrics = cfg.auth.public_metrics,
            public_health = cfg.auth.public_health,
            "authentication on (SIGHUP reloads the tokens)"
        );
    } else {
        tracing::info!("authentication off (--auth-tokens FILE turns it on; docs/security.md)");
    }
}

/// Warns when the disk tier's budget is larger than the free space of its
/// filesystem: writes would then fail with "disk full" before eviction starts.
fn check_disk_space(cfg: &Config) {
    if cfg.disk.dir.is_empty() {
        return;
    }
    let mut dir = std::path::Path::new(&cfg.disk.dir);
    while !dir.exists() {
        match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => dir = p,
            _ => return,
        }
    }
    let Ok(st) = nix::sys::statvfs::statvfs(dir) else {
        return;
    };
    let free = st.blocks_available() * st.fragment_size();
    let held = dir_bytes(std::path::Path::new(&cfg.disk.dir));
    let budget = cfg.disk.capacity.bytes();
    if budget > free + held {
        tracing::warn!(
            "disk.capacity {} is more than the disk tier can get: {} free on the filesystem of {} \
             plus {} it already holds; writes will fail with disk full before eviction makes room \
             (lower --disk-capacity)",
            cfg.disk.capacity,
            human(free),
            dir.display(),
            human(held)
        );
    }
}

fn human(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Bytes of the files under `dir` (what the disk tier holds from a previous run).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        serve: ServeArgs,
    }

    /// Every "[key, default X]" in `serve --help` is the real default of that key.
    #[test]
    fn help_defaults_match_the_config_defaults() {
        let defaults: toml::Value = toml::from_str(&Config::default().to_toml()).unwrap();
        let mut cmd = Wrap::command();
        let help = cmd.render_long_help().to_string();
        let mut checked = 0;
        for part in help.split('[').skip(1) {
            let Some((name, rest)) = part.split_once(", default ") else {
                continue;
            };
            let Some((section, key)) = name.split_once('.') else {
                continue;
            };
            // Help text wraps long lines: rejoin before comparing.
            let shown = rest
                .split(']')
                .next()
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let v = &defaults[section][key];
            let real = match v {
                toml::Value::String(s) if s.is_empty() => "\"\"".to_string(),
                toml::Value::String(s) => s.clone(),
                toml::Value::Array(a) => a
                    .iter()
                    .map(|x| x.as_str().unwrap_or_default().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                other => other.to_string(),
            };
            let shown = shown.split(" (").next().unwrap();
            assert_eq!(shown, real, "help says {section}.{key} defaults to {shown}");
            checked += 1;
        }
        assert!(checked >= 15, "only {checked} defaults found in:\n{help}");
    }
}
