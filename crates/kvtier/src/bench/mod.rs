//! `kvtier bench`: latency-vs-concurrency sweeps against kvtier (and a Redis
//! competitor), written as `record.json`, `summary.md` and `report.html`;
//! `kvtier bench ab` (two binaries, alternating repeats: `ab.rs`) and
//! `kvtier bench compare A B` (what changed between two perf records).
mod ab;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use kvtier_bench::competitors::CompetitorSpec;
use kvtier_bench::competitors::redis::CompetitorClient;
use kvtier_bench::run::{BenchConfig, run as run_sweep, worker_main};
use kvtier_bench::workloads::{Api, Transport, Workload};
use kvtier_core::ByteSize;

/// Flags of `kvtier bench`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    cmd: Option<BenchCmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// What changed between two perf records (any with the header: a
    /// `kvtier bench` or `bench ab` record.json, notes/*.json): conditions
    /// first (commit, dirty, machine, command, versions), then the numbers
    /// with B / A.
    Compare {
        /// Two records: A (the baseline), then B.
        #[arg(num_args = 2, required = true, value_name = "RECORD")]
        records: Vec<PathBuf>,
    },
    /// A/B of two revisions (or one with and without a setting): builds
    /// both (cached per commit), runs the bench workload on each in
    /// alternating repeats, writes both sides and head / base of the medians.
    Ab(Box<ab::AbArgs>),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Start an in-process kvtier server for the run (the default without --target).
    #[arg(long, conflicts_with = "target")]
    spawn: bool,
    /// Server to drive: grpc://HOST:PORT; or a cluster's nodes,
    /// comma-separated (grpc://H1:P1,grpc://H2:P2,...), which --api v1 drives
    /// through the node list (the Rust ClusterClient sends each block to a node
    /// that owns it; the list goes in the record).
    #[arg(long)]
    target: Option<String>,
    /// lookup | read | write | mixed | conversation | kv | ping | lookup-ping | prefix-read.
    #[arg(long, value_parser = Workload::parse)]
    workload: Option<Workload>,
    /// v1 (kvtier.v1 via the Rust client) | kvstore (kvstore.KVStoreService;
    /// `compat`, its old name, is read too).
    #[arg(long, default_value = "v1", value_parser = Api::parse)]
    api: Api,
    /// v1 Read/Write transport: auto (the data plane when the server offers
    /// one) | grpc | data-plane. Recorded as api `v1+wire` / `v1+grpc`.
    #[arg(long, default_value = "auto", value_parser = Transport::parse)]
    transport: Transport,
    /// Redis competitor client: resp (hand-written RESP2) | redis-rs (the redis crate).
    #[arg(long, alias = "peer-client", default_value = "resp", value_parser = CompetitorClient::parse)]
    competitor_client: CompetitorClient,
    /// Also run each competitor's own benchmark tool at each concurrency
    /// (read/write workloads): redis-benchmark; comparisons use the better
    /// of it and the bench's own client.
    #[arg(long, alias = "peer-tool")]
    competitor_tool: bool,
    /// Payload per block, e.g. 1.2MB, 64KB (default: 1.2MB; conversation 512B; kv 100B).
    #[arg(long)]
    value_size: Option<ByteSize>,
    /// Closed-loop workers per process, one step each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,5,10,20,50,100,200")]
    concurrency: Vec<u32>,
    /// Generator processes (> 1: separate OS processes, histograms merged).
    #[arg(long, default_value_t = 1)]
    processes: u32,
    /// Open loop: total request rates per second, one step each (pool: the largest --concurrency).
    #[arg(long, value_delimiter = ',')]
    rate: Vec<f64>,
    /// Measured time per repeat (e.g. 10s, 300ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up per repeat, excluded.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Repeats per step (merged; spread kept for significance).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Competitors to compare with (the `--peer*` flags are the old names of
    /// `--competitor*`, still accepted), comma-separated: redis://HOST:PORT,
    /// redis://spawn (a private redis-server), mooncake://spawn (a private
    /// Mooncake Store: scripts/setup-mooncake.sh installs it).
    #[arg(long, alias = "peer", value_delimiter = ',', value_parser = CompetitorSpec::parse)]
    competitor: Vec<CompetitorSpec>,
    /// CPUs of the competitors spawned by this run (`taskset -c` list, e.g. 1):
    /// pin them where the kvtier server under test runs.
    #[arg(long, alias = "peer-cpus")]
    competitor_cpus: Option<String>,
    /// SLAs, e.g. read.p99=100ms,lookup.p50<5ms.
    #[arg(long)]
    sla: Option<String>,
    /// Capacity planning target, tokens/s.
    #[arg(long)]
    target_tokens_per_s: Option<f64>,
    /// Measure raw loopback TCP throughput first (link probe).
    #[arg(long)]
    probe: bool,
    /// HTTP/2 connections per process to kvtier.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Most data-plane connections one long read is striped over (1: one
    /// connection per read). `prefix-read` opens this many per worker.
    #[arg(long, default_value_t = kvtier_client::wire::MAX_STRIPES)]
    read_stripes: usize,
    /// Client retries of a request the server shed (UNAVAILABLE) [default:
    /// the client's, 2]. With 0 every attempt is measured: shed requests
    /// count as errors, admitted ones keep their own latency, and the worker
    /// backs off 10–20 ms (jittered, the client's first back-off) after a shed, as a client would.
    #[arg(long)]
    retries: Option<u32>,
    /// TCP congestion control of the data-plane connections ("" = system
    /// default); the server sets its own (server.data_tcp_congestion).
    #[arg(long, default_value = "")]
    data_tcp_congestion: String,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
    /// Output directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal: run as a generator child process with this spec.
    #[arg(long, hide = true)]
    worker: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 10s, 300ms"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" | "min" => n * 60.0,
        "us" | "µs" => n / 1e6,
        _ => return Err(format!("invalid duration unit {unit:?} in {s:?}")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// Runs `kvtier bench`.
pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
    match a.cmd {
        Some(BenchCmd::Compare { records }) => {
            let text = kvtier_bench::diff::compare_files(&records[0], &records[1])?;
            return crate::cli::print(text);
        }
        Some(BenchCmd::Ab(ab)) => return tokio::task::spawn_blocking(move || ab::run(*ab)).await?,
        None => {}
    }
    let r = a.run;
    if let Some(spec) = r.worker {
        return worker_main(&spec).await;
    }
    let workload = r
        .workload
        .ok_or_else(|| anyhow::anyhow!("--workload is required"))?;
    let out = r
        .out
        .ok_or_else(|| anyhow::anyhow!("--out DIR is required"))?;
    let mut cfg = BenchConfig::new(workload);
    cfg.target = if r.spawn { None } else { r.target };
    cfg.api = r.api;
    cfg.transport = r.transport;
    cfg.competitor_client = r.competitor_client;
    cfg.competitor_tool = r.competitor_tool;
    cfg.value_size = r.value_size.map(ByteSize::bytes);
    cfg.concurrency = r.concurrency;
    cfg.processes = r.processes.max(1);
    cfg.rates = r.rate;
    cfg.duration = r.duration;
    cfg.warmup = r.warmup;
    cfg.repeat = r.repeat.max(1);
    cfg.competitors = r.competitor;
    cfg.competitor_cpus = r.competitor_cpus;
    cfg.slas = r
        .sla
        .map(|s| {
            s.split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        })
        .unwrap_or_default();
    cfg.target_tokens_per_s = r.target_tokens_per_s;
    cfg.probe = r.probe;
    cfg.connections = r.connections.max(1);
    cfg.read_stripes = r.read_stripes.max(1);
    cfg.data_tcp_congestion = r.data_tcp_congestion;
    cfg.retries = r.retries;
    cfg.quiet = r.quiet;
    // The sweep builds its own runtimes: run it on a plain thread.
    let record = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || run_sweep(&cfg))
            .join()
            .map_err(|_| anyhow::anyhow!("bench thread panicked"))?
    })
    .await??;
    kvtier_bench::write_outputs(&out, &record)?;
    crate::cli::print(format!(
        "wrote {0}/record.json, {0}/summary.md, {0}/report.html\n",
        out.display()
    ))?;
    Ok(())
}
