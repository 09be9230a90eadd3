//! `kvtier bench`: runs a sweep and assembles the [`Record`].
//!
//! * The system under test is a target address or, with none, an in-process
//!   server started for the run (`--spawn`) on its own runtime (threads
//!   `kvtier-srv`), so the generator's CPU (threads `kvtier-gen`) is measured
//!   apart from the server's even though they share the machine.
//! * `--processes P > 1` runs each repeat of each step in P separate OS
//!   processes (`kvtier bench --worker SPEC`), started together (each connects,
//!   says `ready`, and starts on `go`); their histograms are merged.
//! * With competitors, each step runs against kvtier and every competitor at the same
//!   load, repeats alternating between the systems.
//!
//! The sweep in parts: `setup` starts the target and the competitors, `runner`
//! executes the steps (repeats alternating between systems), `worker` is one
//! process's share of a repeat (also the `--worker` child mode), and
//! `reference` runs the competitors' own tools. This file holds the configuration
//! and [`run`], which puts them in order and assembles the record.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::competitors::CompetitorSpec;
use crate::competitors::redis::{self as competitor_redis, CompetitorClient};
use crate::load::{Load, Progress, cores};
use crate::netobs::Sel;
use crate::record::{ClusterTarget, CompetitorRun, LinkProbe, Mode, Network, Record};
use crate::workloads::{Api, Conn, ConnOpts, Ctx, Transport, Workload, target_addrs};

mod reference;
mod runner;
mod setup;
mod worker;

pub use worker::{System, WorkerSpec, worker_main};

use reference::competitor_references;
use runner::Runner;
use setup::{Competitor, Target, port_of, start_peers};

/// Thread-name prefix of the generator runtime.
pub const GEN_THREADS: &str = "kvtier-gen";

/// Memory of a spawned competitor (Redis `maxmemory`, Mooncake's segment): the
/// same as kvtier's default memory tier, so all hold the same data.
pub const COMPETITOR_MEMORY: u64 = 2 << 30;

/// Everything `kvtier bench` was asked to do.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// `grpc://HOST:PORT` / `http://HOST:PORT`; `None` spawns an in-process server.
    pub target: Option<String>,
    /// Workload.
    pub workload: Workload,
    /// API.
    pub api: Api,
    /// Read/Write transport of the v1 API.
    pub transport: Transport,
    /// Client library of the Redis competitor.
    pub competitor_client: CompetitorClient,
    /// Also run the competitor's own benchmark tool (`redis-benchmark`) at each
    /// closed-loop concurrency (read / write workloads).
    pub competitor_tool: bool,
    /// Payload bytes per block (`None`: the workload's default).
    pub value_size: Option<u64>,
    /// Closed-loop workers per process, one step each (also the open-loop pool: the largest).
    pub concurrency: Vec<u32>,
    /// Generator processes.
    pub processes: u32,
    /// Open-loop rates (total units/s); when non-empty the sweep is open loop.
    pub rates: Vec<f64>,
    /// Measured time per repeat.
    pub duration: Duration,
    /// Warm-up per repeat (excluded).
    pub warmup: Duration,
    /// Repeats per step.
    pub repeat: u32,
    /// Competitors to measure in the same run.
    pub competitors: Vec<CompetitorSpec>,
    /// CPUs (a `taskset -c` list) of the competitors this run spawns.
    pub competitor_cpus: Option<String>,
    /// SLA strings.
    pub slas: Vec<String>,
    /// Capacity-planning target.
    pub target_tokens_per_s: Option<f64>,
    /// Run the loopback TCP probe.
    pub probe: bool,
    /// TCP congestion control of the client's data-plane connections ("": system default).
    pub data_tcp_congestion: String,
    /// HTTP/2 connections per process to kvtier.
    pub connections: usize,
    /// Most data-plane connections one long read is striped over (1: never;
    /// `prefix-read` opens this many per worker).
    pub read_stripes: usize,
    /// Client retries of a request the server shed (UNAVAILABLE); `None`:
    /// the client's default (2). With 0 every attempt is a sample: shed ones
    /// count as errors and the worker backs off like a client would.
    pub retries: Option<u32>,
    /// No progress output.
    pub quiet: bool,
    /// The binary to run as `bench --worker` (default: this executable).
    pub worker_exe: Option<PathBuf>,
}

impl BenchConfig {
    /// Defaults for `workload`: spawn, v1, c = 1,2,5,10,20,50,100,200, 10 s + 2 s warm-up.
    pub fn new(workload: Workload) -> Self {
        BenchConfig {
            target: None,
            workload,
            api: Api::V1,
            transport: Transport::Auto,
            competitor_client: CompetitorClient::Resp,
            competitor_tool: false,
            value_size: None,
            concurrency: vec![1, 2, 5, 10, 20, 50, 100, 200],
            processes: 1,
            rates: Vec::new(),
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            repeat: 1,
            competitors: Vec::new(),
            competitor_cpus: None,
            slas: Vec::new(),
            target_tokens_per_s: None,
            probe: false,
            connections: 4,
            read_stripes: kvtier_client::wire::MAX_STRIPES,
            retries: None,
            data_tcp_congestion: String::new(),
            quiet: false,
            worker_exe: None,
        }
    }
}

fn check(cfg: &BenchConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(cfg.workload == Workload::Kv && cfg.api == Api::KvStore),
        "the kv workload needs --api v1 (the kvstore API has no text keys)"
    );
    anyhow::ensure!(
        !(matches!(cfg.workload, Workload::Ping | Workload::LookupPing) && cfg.api == Api::KvStore),
        "the ping workloads need --api v1"
    );
    anyhow::ensure!(
        cfg.workload != Workload::PrefixRead || (cfg.api == Api::V1 && cfg.competitors.is_empty()),
        "the prefix-read workload needs --api v1 and no --competitor (no competitor implements it yet)"
    );
    let nodes = cfg.target.as_deref().map_or(0, |t| target_addrs(t).len());
    anyhow::ensure!(
        nodes <= 1 || cfg.api == Api::V1,
        "--target lists {nodes} addresses (a cluster's nodes): only --api v1 drives a cluster \
         (through the node list); give --api kvstore one address"
    );
    anyhow::ensure!(
        !cfg.concurrency.is_empty() || !cfg.rates.is_empty(),
        "nothing to run: give --concurrency or --rate"
    );
    Ok(())
}

/// One (load, mode, label) per step: closed concurrencies or open rates.
fn loads(cfg: &BenchConfig) -> Vec<(Load, Mode, String)> {
    if !cfg.rates.is_empty() {
        let pool = cfg.concurrency.iter().copied().max().unwrap_or(64).max(1);
        return cfg
            .rates
            .iter()
            .map(|&r| {
                (
                    Load::Open { rate: r, pool },
                    Mode::Open { rate_per_s: r },
                    format!("rate={r}/s"),
                )
            })
            .collect();
    }
    cfg.concurrency
        .iter()
        .map(|&c| {
            let total = c * cfg.processes.max(1);
            let name = if cfg.processes > 1 {
                format!("c={total} ({}×{c})", cfg.processes)
            } else {
                format!("c={c}")
            };
            (Load::Closed(c), Mode::Closed { concurrency: c }, name)
        })
        .collect()
}

/// Runs the sweep. Call from a thread that is not inside a Tokio runtime.
pub fn run(cfg: &BenchConfig) -> anyhow::Result<Record> {
    check(cfg)?;
    let value_size = cfg
        .value_size
        .unwrap_or_else(|| cfg.workload.default_value_size()) as usize;
    let gen_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores() as usize)
        .thread_name(GEN_THREADS)
        .enable_all()
        .build()?;
    let target = Target::start(cfg)?;
    let mut competitors = start_peers(cfg)?;
    let system_cc = crate::netobs::system_default();
    let nonce = nonce();
    let progress = Progress::new(cfg.quiet);
    let link_probe: Option<LinkProbe> = if cfg.probe {
        let p = gen_rt.block_on(crate::probe::loopback_probe(4, Duration::from_millis(1500)))?;
        if !cfg.quiet {
            println!(
                "link probe: {:.1} Gbit/s ({} streams)",
                p.gbit_per_s, p.streams
            );
        }
        Some(p)
    } else {
        None
    };
    // Preload kvtier and the Redis competitors with the same data.
    let ctx_pre = Ctx::new(cfg.workload, value_size, nonce);
    let (data_addrs, wire, replicas) = gen_rt.block_on(async {
        let opts = ConnOpts {
            api: cfg.api,
            connections: 1,
            transport: cfg.transport,
            data_connections: 1,
            read_stripes: 1,
            long_reads: false,
            data_tcp_congestion: cfg.data_tcp_congestion.clone(),
            retries: None,
            ping: false,
        };
        let conn = Conn::connect(opts, &target.addr).await?;
        let mut ctx = Ctx::new(cfg.workload, value_size, nonce);
        ctx.preload(&conn).await?;
        let wire = conn.uses_data_plane();
        for p in &mut competitors {
            if let Competitor::Bench { url, name, .. } = p {
                let mut c = competitor_redis::connect(url, cfg.competitor_client).await?;
                competitor_redis::preload(&ctx_pre, &mut c).await?;
                *name = competitor_redis::version(&mut c).await;
            }
        }
        anyhow::Ok((conn.data_plane_addrs(), wire, conn.cluster_replicas()))
    })?;
    let kv_sockets = Sel {
        ports: target_addrs(&target.addr)
            .iter()
            .filter_map(|a| port_of(a))
            .chain(data_addrs.iter().map(|a| a.port()))
            .collect(),
        pids: Vec::new(),
    };
    let mut runner = Runner {
        cfg,
        rt: gen_rt,
        progress,
        nonce,
        value_size,
        next_worker: 0,
        observed_cc: BTreeMap::new(),
    };
    let kv_system = System::Kvtier {
        target: target.addr.clone(),
        api: cfg.api,
        transport: cfg.transport,
    };
    let mut steps = Vec::new();
    let mut competitor_runs: Vec<CompetitorRun> = competitors
        .iter()
        .map(|p| CompetitorRun {
            name: p.name(),
            op_map: match p {
                Competitor::Mooncake(_) => [("read", "get"), ("write", "put")]
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .into(),
                Competitor::Bench { .. } => Default::default(),
            },
            ..Default::default()
        })
        .collect();
    for (load, mode, name) in &loads(cfg) {
        let (kv, ps, how) =
            runner.step_all(&kv_system, &kv_sockets, &competitors, *load, *mode, name)?;
        steps.push(kv);
        for ((run, step), how) in competitor_runs.iter_mut().zip(ps).zip(how) {
            run.steps.push(step);
            run.client = how;
        }
    }
    let Runner {
        rt: gen_rt,
        observed_cc,
        ..
    } = runner;
    drop(gen_rt);
    competitor_references(cfg, &competitors, &mut competitor_runs, value_size)?;
    let target_desc = target.desc.clone();
    target.stop()?;
    drop(competitors);
    let mut rec = Record::new(
        cfg.workload.name(),
        cfg.api.record_name(wire),
        value_size as u64,
        &target_desc,
    );
    rec.git_commit = crate::record::git_commit();
    rec.cluster = replicas.map(|replicas| ClusterTarget {
        nodes: target_addrs(&target_desc),
        replicas,
    });
    rec.analysis_config.slas = cfg.slas.clone();
    rec.analysis_config.target_tokens_per_s = cfg.target_tokens_per_s;
    rec.steps = steps;
    rec.link_probe = link_probe;
    rec.competitors = competitor_runs;
    // The header's versions: each competitor's name is "<tool> <version>".
    let competitor_versions: Vec<(String, Option<String>)> = rec
        .competitors
        .iter()
        .map(|p| match p.name.split_once(' ') {
            Some((tool, v)) => (tool.to_string(), Some(v.to_string())),
            None => (p.name.clone(), None),
        })
        .collect();
    rec.versions.extend(competitor_versions);
    rec.network = Some(Network {
        system_default_cc: system_cc,
        kvtier_client_cc: cfg.data_tcp_congestion.clone(),
        observed_cc,
    });
    Ok(rec)
}

fn nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    crate::workloads::mix(t ^ (u64::from(std::process::id()) << 40))
}
