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
    /// gRPC listen address, repeatable; `ADDR@CPUSET` pins [server.listen].
    #[arg(long = "listen")]
    listen: Vec<String>,
    /// Bulk data-plane address, "auto" (gRPC port + 1) or "" to disable [server.data_listen].
    #[arg(long)]
    data_listen: Option<String>,
    /// TCP congestion control of data-plane connections, "" = system default [server.data_tcp_congestion].
    #[arg(long)]
    data_tcp_congestion: Option<String>,
    /// One gRPC listener per NUMA node (port + node), pinned to its CPUs [server.numa].
    #[arg(long)]
    numa: bool,
    /// HTTP listen address; "" disables HTTP [server.http_listen].
    #[arg(long)]
    http_listen: Option<String>,
    /// Memory-tier budget, e.g. 2GiB [engine.memory_capacity].
    #[arg(long)]
    memory_capacity: Option<ByteSize>,
    /// Largest block/value payload, e.g. 64MiB [engine.max_block_size].
    #[arg(long)]
    max_block_size: Option<ByteSize>,
    /// Default tokens per block [engine.block_size].
    #[arg(long)]
    block_size: Option<usize>,
    /// Requests served at once [server.max_inflight].
    #[arg(long)]
    max_inflight: Option<usize>,
    /// Largest gRPC message [server.max_message_size].
    #[arg(long)]
    max_message_size: Option<ByteSize>,
    /// Disk-tier directory; enables the disk tier [disk.dir].
    #[arg(long)]
    disk_dir: Option<String>,
    /// Disk-tier budget, e.g. 100GiB [disk.capacity].
    #[arg(long)]
    disk_capacity: Option<ByteSize>,
    /// always | batch | never [disk.sync].
    #[arg(long)]
    disk_sync: Option<kvtier_core::SyncMode>,
    /// write-through | write-back [disk.write_policy].
    #[arg(long)]
    write_policy: Option<String>,
    /// Shared object store: az://container/prefix, s3://bucket/prefix,
    /// file:///dir; credentials and endpoints from AZURE_* / AWS_* [object_store.url].
    #[arg(long)]
    object_store: Option<String>,
    /// write-back | write-through towards the object store [object_store.write_policy].
    #[arg(long)]
    object_write_policy: Option<String>,
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
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Runs the server until SIGINT / SIGTERM, then shuts down gracefully.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = args.config()?;
    if args.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    let mut server = Server::start(cfg).await?;
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
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        r = server.wait() => { r?; anyhow::bail!("a listener stopped unexpectedly"); }
    }
    server.shutdown().await?;
    tracing::info!("stopped");
    Ok(())
}
