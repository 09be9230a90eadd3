//! `kvtier bench`: runs a sweep and assembles the [`Record`].
//!
//! * The system under test is a target address or, with none, an in-process
//!   server started for the run (`--spawn`) on its own runtime (threads
//!   `kvtier-srv`), so the generator's CPU (threads `kvtier-gen`) is measured
//!   apart from the server's even though they share the machine.
//! * `--processes P > 1` runs each repeat of each step in P separate OS
//!   processes (`kvtier bench --worker SPEC`), started together (each connects,
//!   says `ready`, and starts on `go`); their histograms are merged.
//! * With a peer, each step runs against kvtier (all repeats), then against
//!   the peer at the same load.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::builder::{RepeatInput, StepBuilder};
use crate::load::{Load, Progress, WireRepeat, cores, run_repeat, thread_cpu};
use crate::peer_redis::{self, PeerClient, RedisWorker, SpawnedRedis};
use crate::record::{LinkProbe, Mode, PeerReference, PeerRun, Record, ReferenceRow, Step};
use crate::workloads::{Api, Conn, ConnOpts, Ctx, KvWorker, Transport, WorkerId, Workload};

/// Thread-name prefix of the generator runtime.
pub const GEN_THREADS: &str = "kvtier-gen";

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
    /// Client library of the Redis peer.
    pub peer_client: PeerClient,
    /// Also run the peer's own benchmark tool (`redis-benchmark`) at each
    /// closed-loop concurrency (read / write workloads).
    pub peer_tool: bool,
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
    /// `redis://HOST:PORT` or `redis://spawn`.
    pub peer: Option<String>,
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
            peer_client: PeerClient::Resp,
            peer_tool: false,
            value_size: None,
            concurrency: vec![1, 2, 5, 10, 20, 50, 100, 200],
            processes: 1,
            rates: Vec::new(),
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            repeat: 1,
            peer: None,
            slas: Vec::new(),
            target_tokens_per_s: None,
            probe: false,
            connections: 4,
            retries: None,
            data_tcp_congestion: "reno".into(),
            quiet: false,
            worker_exe: None,
        }
    }
}

/// What a process drives.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum System {
    /// kvtier at `target` through `api`.
    Kvtier {
        /// Address.
        target: String,
        /// API.
        api: Api,
        /// Read/Write transport.
        #[serde(default)]
        transport: Transport,
    },
    /// Redis at `url`.
    Redis {
        /// `redis://HOST:PORT`.
        url: String,
        /// Client library.
        #[serde(default)]
        client: PeerClient,
    },
}

/// One process's share of one repeat (what `bench --worker` receives).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// What to drive.
    pub system: System,
    /// Workload.
    pub workload: Workload,
    /// Payload bytes.
    pub value_size: usize,
    /// Run nonce (names the preloaded data).
    pub nonce: u64,
    /// Load of this process.
    pub load: Load,
    /// Warm-up, ms.
    pub warmup_ms: u64,
    /// Measured time, ms.
    pub duration_ms: u64,
    /// Id of this process's first worker (unique over the run).
    pub first_worker: u64,
    /// HTTP/2 connections to kvtier.
    pub connections: usize,
    /// TCP congestion control of data-plane connections ("": system default).
    #[serde(default)]
    pub data_tcp_congestion: String,
    /// Client retries of shed requests (`None`: the client's default).
    #[serde(default)]
    pub retries: Option<u32>,
}

fn workers_of(load: Load) -> u32 {
    match load {
        Load::Closed(n) => n,
        Load::Open { pool, .. } => pool,
    }
}

/// Runs one process's share of a repeat in the current runtime.
async fn local_repeat(
    spec: &WorkerSpec,
    progress: &Progress,
    label: &str,
    cpu: &(dyn Fn() -> Duration + Sync),
) -> anyhow::Result<RepeatInput> {
    let n = workers_of(spec.load);
    let mut ctx = Ctx::new(spec.workload, spec.value_size, spec.nonce);
    let wid = |i: u32| WorkerId {
        nonce: spec.nonce,
        id: spec.first_worker + u64::from(i),
    };
    let warm = Duration::from_millis(spec.warmup_ms);
    let dur = Duration::from_millis(spec.duration_ms);
    match &spec.system {
        System::Kvtier {
            target,
            api,
            transport,
        } => {
            let opts = ConnOpts {
                api: *api,
                connections: spec.connections,
                transport: *transport,
                // One data-plane connection per worker, like the Redis peer.
                data_connections: n as usize,
                data_tcp_congestion: spec.data_tcp_congestion.clone(),
                retries: spec.retries,
                ping: matches!(spec.workload, Workload::Ping | Workload::LookupPing),
            };
            let conn = Conn::connect(opts, target).await?;
            ctx.discover(&conn).await?;
            let ctx = Arc::new(ctx);
            let workers = (0..n)
                .map(|i| KvWorker::new(ctx.clone(), &conn, wid(i)))
                .collect();
            Ok(
                run_repeat(workers, spec.load, warm, dur, progress, label, cpu)
                    .await?
                    .0,
            )
        }
        System::Redis { url, client } => {
            let ctx = Arc::new(ctx);
            let mut workers = Vec::with_capacity(n as usize);
            for i in 0..n {
                workers.push(RedisWorker::new(ctx.clone(), url, *client, wid(i)).await?);
            }
            Ok(
                run_repeat(workers, spec.load, warm, dur, progress, label, cpu)
                    .await?
                    .0,
            )
        }
    }
}

/// Child-process mode (`kvtier bench --worker SPEC`): connect, print `ready`,
/// wait for a line on stdin, run, print the [`WireRepeat`] JSON on one line.
pub async fn worker_main(spec_json: &str) -> anyhow::Result<()> {
    let spec: WorkerSpec = serde_json::from_str(spec_json).context("parsing worker spec")?;
    // Connecting happens inside local_repeat; readiness means "parsed and about to start".
    let progress = Progress::new(true);
    println!("ready");
    std::io::stdout().flush()?;
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)
    })
    .await??;
    let cpu = || thread_cpu(None);
    let r = local_repeat(&spec, &progress, "", &cpu).await?;
    println!("{}", serde_json::to_string(&WireRepeat::from_input(&r))?);
    Ok(())
}

struct Runner<'a> {
    cfg: &'a BenchConfig,
    rt: tokio::runtime::Runtime,
    progress: Progress,
    nonce: u64,
    value_size: usize,
    next_worker: u64,
}

impl Runner<'_> {
    /// One repeat of one step: in this process or in `processes` children.
    fn repeat(&mut self, system: &System, load: Load, label: &str) -> anyhow::Result<RepeatInput> {
        let p = self.cfg.processes.max(1);
        let per_proc = match load {
            Load::Closed(n) => Load::Closed(n),
            Load::Open { rate, pool } => Load::Open {
                rate: rate / f64::from(p),
                pool,
            },
        };
        let mut spec = WorkerSpec {
            system: system.clone(),
            workload: self.cfg.workload,
            value_size: self.value_size,
            nonce: self.nonce,
            load: per_proc,
            warmup_ms: self.cfg.warmup.as_millis() as u64,
            duration_ms: self.cfg.duration.as_millis() as u64,
            first_worker: self.next_worker,
            connections: self.cfg.connections,
            data_tcp_congestion: self.cfg.data_tcp_congestion.clone(),
            retries: self.cfg.retries,
        };
        self.next_worker += u64::from(p) * u64::from(workers_of(per_proc));
        let r = if p == 1 {
            let cpu = || thread_cpu(Some(GEN_THREADS));
            self.rt
                .block_on(local_repeat(&spec, &self.progress, label, &cpu))?
        } else {
            let exe = match &self.cfg.worker_exe {
                Some(e) => e.clone(),
                None => std::env::current_exe()?,
            };
            let mut children = Vec::new();
            for i in 0..p {
                spec.first_worker =
                    self.next_worker - u64::from(p - i) * u64::from(workers_of(per_proc));
                let mut child = Command::new(&exe)
                    .args(["bench", "--worker", &serde_json::to_string(&spec)?])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .with_context(|| format!("starting {} bench --worker", exe.display()))?;
                let mut out = BufReader::new(child.stdout.take().expect("piped"));
                let mut line = String::new();
                out.read_line(&mut line)?;
                anyhow::ensure!(line.trim() == "ready", "worker process said {line:?}");
                children.push((child, out));
            }
            for (c, _) in &mut children {
                writeln!(c.stdin.as_mut().expect("piped"), "go")?;
            }
            let mut merged: Option<RepeatInput> = None;
            for (mut c, mut out) in children {
                let mut line = String::new();
                out.read_line(&mut line)?;
                let st = c.wait()?;
                anyhow::ensure!(
                    st.success() && !line.is_empty(),
                    "worker process failed: {st}"
                );
                let r: WireRepeat = serde_json::from_str(&line).context("worker output")?;
                let r = r.into_input()?;
                match &mut merged {
                    Some(m) => m.merge_process(&r)?,
                    None => merged = Some(r),
                }
            }
            merged.expect("p >= 2")
        };
        self.progress.done(label, &r);
        Ok(r)
    }

    /// One step for kvtier and, when given, the peer: repeats alternate
    /// (kvtier, peer, kvtier, peer, ...) so that drift on a shared machine
    /// lands on both systems alike instead of on whichever ran second.
    fn step_pair(
        &mut self,
        kv: &System,
        peer: Option<&System>,
        load: Load,
        mode: Mode,
        name: &str,
    ) -> anyhow::Result<(Step, Option<Step>)> {
        let mut kb = StepBuilder::new(mode, self.cfg.processes);
        let mut pb = peer.map(|_| StepBuilder::new(mode, self.cfg.processes));
        let k = self.cfg.repeat.max(1);
        for rep in 0..k {
            let label = format!("{name} rep {}/{k}", rep + 1);
            kb.add_repeat(self.repeat(kv, load, &label)?);
            if let (Some(sys), Some(pb)) = (peer, pb.as_mut()) {
                pb.add_repeat(self.repeat(sys, load, &format!("redis {label}"))?);
            }
        }
        Ok((kb.build()?, pb.map(|b| b.build()).transpose()?))
    }
}

fn nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    crate::workloads::mix(t ^ (u64::from(std::process::id()) << 40))
}

/// The default server config with every listener on an ephemeral loopback port
/// (done generically over `server.*listen*` so new listeners are covered too).
fn spawn_config() -> anyhow::Result<kvtier_server::config::Config> {
    let mut v = serde_json::to_value(kvtier_server::config::Config::default())?;
    if let Some(server) = v.get_mut("server").and_then(|s| s.as_object_mut()) {
        for (k, val) in server.iter_mut() {
            if !k.contains("listen") {
                continue;
            }
            match val {
                serde_json::Value::String(s) if !s.is_empty() => *s = "127.0.0.1:0".into(),
                serde_json::Value::Array(a) => {
                    *a = vec![serde_json::Value::String("127.0.0.1:0".into())];
                }
                _ => {}
            }
        }
    }
    Ok(serde_json::from_value(v)?)
}

/// Runs `redis-benchmark -t set,get -d SIZE -c C -n N --csv` against `url`
/// at each concurrency (N: about 3 s of work at ~2,000 req/s, at least 50 per
/// connection).
fn redis_benchmark(
    url: &str,
    value_size: usize,
    concurrency: &[u32],
    quiet: bool,
) -> anyhow::Result<PeerReference> {
    let addr = url.trim_start_matches("redis://");
    let addr = addr.split('/').next().unwrap_or(addr);
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("redis url {url:?} has no port"))?;
    let tool = format!(
        "redis-benchmark -h {host} -p {port} -t set,get -d {value_size} -c {{c}} -n {{n}} --csv"
    );
    let mut rows = Vec::new();
    for &c in concurrency {
        let n = (u64::from(c) * 50).max(6000);
        let out = Command::new("redis-benchmark")
            .args(["-h", host, "-p", port, "-t", "set,get"])
            .args(["-d", &value_size.to_string(), "-c", &c.to_string()])
            .args(["-n", &n.to_string(), "--csv"])
            .stderr(Stdio::null())
            .output()
            .context("running redis-benchmark")?;
        anyhow::ensure!(
            out.status.success(),
            "redis-benchmark failed: {}",
            out.status
        );
        for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
            let f: Vec<&str> = line.split(',').map(|x| x.trim_matches('"')).collect();
            // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
            if f.len() < 7 {
                continue;
            }
            let num = |i: usize| f[i].parse::<f64>().unwrap_or(f64::NAN);
            let row = ReferenceRow {
                concurrency: c,
                op: f[0].to_ascii_lowercase(),
                throughput_ops_s: num(1),
                p50_us: num(4) * 1000.0,
                p99_us: num(6) * 1000.0,
            };
            if !quiet {
                println!(
                    "redis-benchmark c={c}: {} {:.0} ops/s p50 {:.2} ms p99 {:.2} ms",
                    row.op,
                    row.throughput_ops_s,
                    row.p50_us / 1000.0,
                    row.p99_us / 1000.0
                );
            }
            rows.push(row);
        }
    }
    Ok(PeerReference { tool, rows })
}

/// Runs the sweep. Call from a thread that is not inside a Tokio runtime.
pub fn run(cfg: &BenchConfig) -> anyhow::Result<Record> {
    anyhow::ensure!(
        !(cfg.workload == Workload::Kv && cfg.api == Api::Compat),
        "the kv workload needs --api v1 (the kvstore API has no text keys)"
    );
    anyhow::ensure!(
        !(matches!(cfg.workload, Workload::Ping | Workload::LookupPing) && cfg.api == Api::Compat),
        "the ping workloads need --api v1"
    );
    anyhow::ensure!(
        !cfg.concurrency.is_empty() || !cfg.rates.is_empty(),
        "nothing to run: give --concurrency or --rate"
    );
    let value_size = cfg
        .value_size
        .unwrap_or_else(|| cfg.workload.default_value_size()) as usize;
    let gen_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores() as usize)
        .thread_name(GEN_THREADS)
        .enable_all()
        .build()?;
    // The system under test.
    let mut spawned = None;
    let (target, target_desc) = match &cfg.target {
        Some(t) => (t.clone(), t.clone()),
        None => {
            let srv_rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores() as usize)
                .thread_name("kvtier-srv")
                .enable_all()
                .build()?;
            let sc = spawn_config()?;
            let server = srv_rt.block_on(kvtier_server::Server::start(sc))?;
            let addr = server.grpc_addrs[0];
            spawned = Some((srv_rt, server));
            (
                format!("http://{addr}"),
                format!(
                    "grpc://{addr} (in-process server spawned by kvtier bench, default config; \
                     shares the generator's {} cores)",
                    cores()
                ),
            )
        }
    };
    let mut redis_spawned = None;
    let peer_url = match cfg.peer.as_deref() {
        None => None,
        Some("redis://spawn") => {
            let r = SpawnedRedis::start()?;
            let url = r.url.clone();
            redis_spawned = Some(r);
            Some(url)
        }
        Some(u) if u.starts_with("redis://") => Some(u.to_string()),
        Some(u) => {
            anyhow::bail!("unsupported peer {u:?}: expected redis://HOST:PORT or redis://spawn")
        }
    };
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
    // Preload.
    let ctx_pre = Ctx::new(cfg.workload, value_size, nonce);
    let (peer_name, wire) = gen_rt.block_on(async {
        let opts = ConnOpts {
            api: cfg.api,
            connections: 1,
            transport: cfg.transport,
            data_connections: 1,
            data_tcp_congestion: cfg.data_tcp_congestion.clone(),
            retries: None,
            ping: false,
        };
        let conn = Conn::connect(opts, &target).await?;
        let mut ctx = Ctx::new(cfg.workload, value_size, nonce);
        ctx.preload(&conn).await?;
        let wire = conn.uses_data_plane();
        match &peer_url {
            Some(url) => {
                let mut c = peer_redis::connect(url, cfg.peer_client).await?;
                peer_redis::preload(&ctx_pre, &mut c).await?;
                anyhow::Ok((Some(peer_redis::version(&mut c).await), wire))
            }
            None => Ok((None, wire)),
        }
    })?;
    let mut runner = Runner {
        cfg,
        rt: gen_rt,
        progress,
        nonce,
        value_size,
        next_worker: 0,
    };
    let kv_system = System::Kvtier {
        target: target.clone(),
        api: cfg.api,
        transport: cfg.transport,
    };
    let pool = cfg.concurrency.iter().copied().max().unwrap_or(64).max(1);
    let loads: Vec<(Load, Mode, String)> = if cfg.rates.is_empty() {
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
    } else {
        cfg.rates
            .iter()
            .map(|&r| {
                (
                    Load::Open { rate: r, pool },
                    Mode::Open { rate_per_s: r },
                    format!("rate={r}/s"),
                )
            })
            .collect()
    };
    let mut steps = Vec::new();
    let mut peer_steps = Vec::new();
    let peer_system = peer_url.as_ref().map(|url| System::Redis {
        url: url.clone(),
        client: cfg.peer_client,
    });
    for (load, mode, name) in &loads {
        let (kv, peer) = runner.step_pair(&kv_system, peer_system.as_ref(), *load, *mode, name)?;
        steps.push(kv);
        peer_steps.extend(peer);
    }
    let Runner { rt: gen_rt, .. } = runner;
    drop(gen_rt);
    let peer_reference = match &peer_url {
        Some(url)
            if cfg.peer_tool
                && cfg.rates.is_empty()
                && matches!(cfg.workload, Workload::Read | Workload::Write) =>
        {
            Some(redis_benchmark(
                url,
                value_size,
                &cfg.concurrency,
                cfg.quiet,
            )?)
        }
        _ => None,
    };
    if let Some((srv_rt, server)) = spawned {
        srv_rt.block_on(server.shutdown())?;
    }
    drop(redis_spawned);
    let mut rec = Record::new(
        cfg.workload.name(),
        cfg.api.record_name(wire),
        value_size as u64,
        &target_desc,
    );
    rec.git_commit = crate::record::git_commit();
    rec.analysis_config.slas = cfg.slas.clone();
    rec.analysis_config.target_tokens_per_s = cfg.target_tokens_per_s;
    rec.steps = steps;
    rec.link_probe = link_probe;
    rec.peer_reference = peer_reference;
    rec.peer = peer_name.map(|name| PeerRun {
        name,
        op_map: Default::default(),
        steps: peer_steps,
    });
    Ok(rec)
}
