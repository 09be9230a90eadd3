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

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::builder::{RepeatInput, StepBuilder};
use crate::load::{Load, Progress, WireRepeat, cores, run_repeat, thread_cpu};
use crate::netobs::{Sampler, Sel};
use crate::peers::PeerSpec;
use crate::peers::mooncake::SpawnedMooncake;
use crate::peers::redis::{self as peer_redis, PeerClient, RedisWorker, SpawnedRedis};
use crate::record::{LinkProbe, Mode, Network, PeerReference, PeerRun, Record, ReferenceRow, Step};
use crate::workloads::{Api, Conn, ConnOpts, Ctx, KvWorker, Transport, WorkerId, Workload};

/// Thread-name prefix of the generator runtime.
pub const GEN_THREADS: &str = "kvtier-gen";

/// Memory of a spawned peer (Redis `maxmemory`, Mooncake's segment): the
/// same as kvtier's default memory tier, so all hold the same data.
pub const PEER_MEMORY: u64 = 2 << 30;

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
    /// Peers to measure in the same run.
    pub peers: Vec<PeerSpec>,
    /// CPUs (a `taskset -c` list) of the peers this run spawns.
    pub peer_cpus: Option<String>,
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
            peers: Vec::new(),
            peer_cpus: None,
            slas: Vec::new(),
            target_tokens_per_s: None,
            probe: false,
            connections: 4,
            retries: None,
            data_tcp_congestion: String::new(),
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
    /// System name → congestion control seen on its sockets (rule 1).
    observed_cc: BTreeMap<String, BTreeSet<String>>,
}

/// A peer of this run.
enum Peer {
    /// Driven by this bench's own client (Redis) through a [`System`].
    Bench {
        name: String,
        client: String,
        url: String,
        system: System,
        sockets: Sel,
        /// The `redis-server` this run started, stopped on drop.
        _spawned: Option<SpawnedRedis>,
    },
    /// Mooncake Store, through its driver.
    Mooncake(SpawnedMooncake),
}

impl Peer {
    fn name(&self) -> String {
        match self {
            Peer::Bench { name, .. } => name.clone(),
            Peer::Mooncake(m) => m.name(),
        }
    }
}

fn port_of(url: &str) -> Option<u16> {
    url.rsplit(':').next()?.trim_end_matches('/').parse().ok()
}

impl Runner<'_> {
    /// When to sample congestion control: the middle of the measured window.
    fn sample_at(&self) -> Duration {
        self.cfg.warmup + self.cfg.duration / 2
    }

    fn observe(&mut self, system: &str, seen: BTreeSet<String>) {
        self.observed_cc
            .entry(system.to_string())
            .or_default()
            .extend(seen);
    }

    /// One repeat of one step, with the congestion control of `sockets` sampled during it.
    fn observed_repeat(
        &mut self,
        system: &System,
        name: &str,
        sockets: &Sel,
        load: Load,
        label: &str,
    ) -> anyhow::Result<RepeatInput> {
        let sampler = Sampler::start(sockets.clone(), self.sample_at());
        let r = self.repeat(system, load, label);
        self.observe(name, sampler.finish());
        r
    }

    /// One repeat of Mooncake (closed loop, read → get, write → put).
    fn mooncake_repeat(
        &mut self,
        m: &SpawnedMooncake,
        load: Load,
        label: &str,
    ) -> anyhow::Result<(RepeatInput, String)> {
        let Load::Closed(c) = load else {
            anyhow::bail!("the Mooncake peer runs closed-loop steps only (--concurrency)");
        };
        let op = match self.cfg.workload {
            Workload::Read => "get",
            Workload::Write => "put",
            w => anyhow::bail!(
                "the Mooncake peer runs --workload read or write, not {}",
                w.name()
            ),
        };
        let mut pids = m.info.pids.clone();
        let at = self.sample_at();
        let mut sampler = None;
        let r = m.run(
            op,
            c * self.cfg.processes.max(1),
            self.cfg.warmup,
            self.cfg.duration,
            self.value_size,
            |pid| {
                pids.push(pid);
                sampler = Some(Sampler::start(
                    Sel {
                        ports: Vec::new(),
                        pids,
                    },
                    at,
                ));
            },
        )?;
        if let Some(s) = sampler {
            let seen = s.finish();
            self.observe(&m.name(), seen);
        }
        self.progress.done(label, &r.0);
        Ok(r)
    }

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

    /// One step for kvtier and every peer: repeats alternate (kvtier, peer
    /// 1, peer 2, kvtier, ...) so that drift on a shared machine lands on
    /// every system alike instead of on whichever ran last. Returns kvtier's
    /// step, each peer's, and how each peer was driven.
    fn step_all(
        &mut self,
        kv: &System,
        kv_sockets: &Sel,
        peers: &[Peer],
        load: Load,
        mode: Mode,
        name: &str,
    ) -> anyhow::Result<(Step, Vec<Step>, Vec<String>)> {
        let mut kb = StepBuilder::new(mode, self.cfg.processes);
        // Mooncake's driver runs the whole concurrency itself; the step keeps
        // kvtier's process count so that both carry the same label.
        let mut pbs: Vec<StepBuilder> = peers
            .iter()
            .map(|_| StepBuilder::new(mode, self.cfg.processes))
            .collect();
        let mut how = vec![String::new(); peers.len()];
        let k = self.cfg.repeat.max(1);
        for rep in 0..k {
            let label = format!("{name} rep {}/{k}", rep + 1);
            kb.add_repeat(self.observed_repeat(kv, "kvtier", kv_sockets, load, &label)?);
            for (i, peer) in peers.iter().enumerate() {
                let plabel = format!("{} {label}", peer.name());
                let r = match peer {
                    Peer::Bench {
                        name,
                        system,
                        sockets,
                        client,
                        ..
                    } => {
                        how[i] = client.clone();
                        self.observed_repeat(system, name, sockets, load, &plabel)?
                    }
                    Peer::Mooncake(m) => {
                        let (r, h) = self.mooncake_repeat(m, load, &plabel)?;
                        how[i] = h;
                        r
                    }
                };
                pbs[i].add_repeat(r);
            }
        }
        let steps = pbs
            .into_iter()
            .map(|b| b.build())
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((kb.build()?, steps, how))
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

/// Runs `redis-benchmark` against `url` at each concurrency: `SET` with a
/// key range of 10⁹ (so that, as kvtier's writes, every SET makes a new key)
/// and `GET` of one key holding a `value_size` value (written right before
/// each GET run without a key range, which names it `key:__rand_int__`, and
/// checked after it with `redis-cli STRLEN`: a GET of an evicted key is a
/// fast miss, not a read). N is about 3 s of work at
/// ~2,000 req/s, at least 50 per connection. The tool's CPU utilisation (of
/// its one thread) comes from `getrusage(RUSAGE_CHILDREN)`.
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
    let d = value_size.to_string();
    let tool = format!(
        "redis-benchmark -h {host} -p {port} -t set -r 1000000000 -d {value_size} -c {{c}} -n {{n}} --csv; \
         redis-benchmark -h {host} -p {port} -t get -d {value_size} -c {{c}} -n {{n}} --csv"
    );
    let run = |args: &[&str]| -> anyhow::Result<(String, f64)> {
        let before = children_cpu();
        let t0 = std::time::Instant::now();
        let out = Command::new("redis-benchmark")
            .args(["-h", host, "-p", port, "-d", &d, "--csv"])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .context("running redis-benchmark")?;
        let wall = t0.elapsed().as_secs_f64();
        anyhow::ensure!(
            out.status.success(),
            "redis-benchmark failed: {}",
            out.status
        );
        let cpu = (children_cpu() - before).as_secs_f64();
        Ok((
            String::from_utf8_lossy(&out.stdout).into_owned(),
            cpu / wall.max(1e-9),
        ))
    };
    // The key GET reads holds a value of `value_size` before and after the
    // GET run: the SET runs before it fill `maxmemory`, and eviction would
    // otherwise turn every GET into a fast miss.
    let get_key_len = || -> anyhow::Result<usize> {
        let out = Command::new("redis-cli")
            .args(["-h", host, "-p", port, "STRLEN", "key:__rand_int__"])
            .output()
            .context("running redis-cli (apt-get install redis-tools)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .parse()
            .with_context(|| format!("redis-cli STRLEN answered {text:?}"))
    };
    let mut rows = Vec::new();
    for &c in concurrency {
        let n = (u64::from(c) * 50).max(6000).to_string();
        let cs = c.to_string();
        for test in [&["-t", "set", "-r", "1000000000"][..], &["-t", "get"][..]] {
            let get = test[1] == "get";
            if get {
                run(&["-t", "set", "-n", "1", "-c", "1"])?;
            }
            let (csv, util) = run(&[test, &["-c", &cs, "-n", &n]].concat())?;
            if get {
                let len = get_key_len()?;
                anyhow::ensure!(
                    len == value_size,
                    "redis-benchmark GET read a {len}-byte value, not {value_size}: its key was evicted"
                );
            }
            for line in csv.lines().skip(1) {
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
                    generator_cpu_utilisation: Some(util),
                };
                if !quiet {
                    println!(
                        "redis-benchmark c={c}: {} {:.0} ops/s p50 {:.2} ms p99 {:.2} ms (tool CPU {:.0}%)",
                        row.op,
                        row.throughput_ops_s,
                        row.p50_us / 1000.0,
                        row.p99_us / 1000.0,
                        util * 100.0
                    );
                }
                rows.push(row);
            }
        }
    }
    Ok(PeerReference { tool, rows })
}

/// CPU time (user + system) of every child process waited for so far.
fn children_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000)
        };
        tv(u.user_time()) + tv(u.system_time())
    })
}

fn check(cfg: &BenchConfig) -> anyhow::Result<()> {
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
    Ok(())
}

/// The system under test: `--target`, or a server started in this process
/// on its own runtime (threads `kvtier-srv`).
struct Target {
    /// Address the clients dial.
    addr: String,
    /// What the record says.
    desc: String,
    spawned: Option<(tokio::runtime::Runtime, kvtier_server::Server)>,
}

impl Target {
    fn start(cfg: &BenchConfig) -> anyhow::Result<Self> {
        if let Some(t) = &cfg.target {
            return Ok(Target {
                addr: t.clone(),
                desc: t.clone(),
                spawned: None,
            });
        }
        let srv_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores() as usize)
            .thread_name("kvtier-srv")
            .enable_all()
            .build()?;
        let server = srv_rt.block_on(kvtier_server::Server::start(spawn_config()?))?;
        let addr = server.grpc_addrs[0];
        Ok(Target {
            addr: format!("http://{addr}"),
            desc: format!(
                "grpc://{addr} (in-process server spawned by kvtier bench, default config; \
                 shares the generator's {} cores)",
                cores()
            ),
            spawned: Some((srv_rt, server)),
        })
    }

    fn stop(self) -> anyhow::Result<()> {
        if let Some((srv_rt, server)) = self.spawned {
            srv_rt.block_on(server.shutdown())?;
        }
        Ok(())
    }
}

/// Starts (or names) every `--peer`; Redis peers get their names once connected.
fn start_peers(cfg: &BenchConfig) -> anyhow::Result<Vec<Peer>> {
    let mut peers = Vec::new();
    for p in &cfg.peers {
        let (url, spawned) = match p {
            PeerSpec::RedisSpawn => {
                let r = SpawnedRedis::start(cfg.peer_cpus.as_deref())?;
                (r.url.clone(), Some(r))
            }
            PeerSpec::MooncakeSpawn => {
                anyhow::ensure!(
                    cfg.rates.is_empty()
                        && matches!(cfg.workload, Workload::Read | Workload::Write),
                    "the Mooncake peer runs closed-loop --workload read or write"
                );
                peers.push(Peer::Mooncake(SpawnedMooncake::start(
                    PEER_MEMORY,
                    cfg.peer_cpus.as_deref(),
                )?));
                continue;
            }
            PeerSpec::Redis(url) => (url.clone(), None),
        };
        peers.push(Peer::Bench {
            name: String::new(),
            client: format!("kvtier bench's Redis client ({})", cfg.peer_client.name()),
            sockets: Sel {
                ports: port_of(&url).into_iter().collect(),
                pids: Vec::new(),
            },
            system: System::Redis {
                url: url.clone(),
                client: cfg.peer_client,
            },
            url,
            _spawned: spawned,
        });
    }
    Ok(peers)
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

/// The peers' own tools at each closed-loop concurrency (comparison rule 2).
fn peer_references(
    cfg: &BenchConfig,
    peers: &[Peer],
    runs: &mut [PeerRun],
    value_size: usize,
) -> anyhow::Result<()> {
    let applies = cfg.peer_tool
        && cfg.rates.is_empty()
        && matches!(cfg.workload, Workload::Read | Workload::Write);
    if !applies {
        return Ok(());
    }
    let totals: Vec<u32> = cfg
        .concurrency
        .iter()
        .map(|c| c * cfg.processes.max(1))
        .collect();
    for (peer, run) in peers.iter().zip(runs) {
        run.reference = match peer {
            Peer::Bench { url, .. } => Some(redis_benchmark(url, value_size, &totals, cfg.quiet)?),
            Peer::Mooncake(m) => m.reference(&totals, cfg.duration, value_size)?,
        };
    }
    Ok(())
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
    let mut peers = start_peers(cfg)?;
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
    // Preload kvtier and the Redis peers with the same data.
    let ctx_pre = Ctx::new(cfg.workload, value_size, nonce);
    let (data_addr, wire) = gen_rt.block_on(async {
        let opts = ConnOpts {
            api: cfg.api,
            connections: 1,
            transport: cfg.transport,
            data_connections: 1,
            data_tcp_congestion: cfg.data_tcp_congestion.clone(),
            retries: None,
            ping: false,
        };
        let conn = Conn::connect(opts, &target.addr).await?;
        let mut ctx = Ctx::new(cfg.workload, value_size, nonce);
        ctx.preload(&conn).await?;
        let wire = conn.uses_data_plane();
        for p in &mut peers {
            if let Peer::Bench { url, name, .. } = p {
                let mut c = peer_redis::connect(url, cfg.peer_client).await?;
                peer_redis::preload(&ctx_pre, &mut c).await?;
                *name = peer_redis::version(&mut c).await;
            }
        }
        anyhow::Ok((conn.data_plane_addr(), wire))
    })?;
    let kv_sockets = Sel {
        ports: port_of(&target.addr)
            .into_iter()
            .chain(data_addr.map(|a| a.port()))
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
    let mut peer_runs: Vec<PeerRun> = peers
        .iter()
        .map(|p| PeerRun {
            name: p.name(),
            op_map: match p {
                Peer::Mooncake(_) => [("read", "get"), ("write", "put")]
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .into(),
                Peer::Bench { .. } => Default::default(),
            },
            ..Default::default()
        })
        .collect();
    for (load, mode, name) in &loads(cfg) {
        let (kv, ps, how) = runner.step_all(&kv_system, &kv_sockets, &peers, *load, *mode, name)?;
        steps.push(kv);
        for ((run, step), how) in peer_runs.iter_mut().zip(ps).zip(how) {
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
    peer_references(cfg, &peers, &mut peer_runs, value_size)?;
    let target_desc = target.desc.clone();
    target.stop()?;
    drop(peers);
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
    rec.peers = peer_runs;
    rec.network = Some(Network {
        system_default_cc: system_cc,
        kvtier_client_cc: cfg.data_tcp_congestion.clone(),
        observed_cc,
    });
    Ok(rec)
}
