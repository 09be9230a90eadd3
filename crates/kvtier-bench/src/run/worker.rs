//! What one generator process runs: a [`WorkerSpec`] (the system to drive
//! and this process's share of one repeat), run either in the sweep's own
//! process or in a child started as `kvtier bench --worker SPEC`
//! ([`worker_main`]). The spec is JSON on the command line, so the parent and
//! its children agree on it through serde alone.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::builder::RepeatInput;
use crate::competitors::redis::{CompetitorClient, RedisWorker};
use crate::load::{ChildReport, Load, Progress, run_repeat, thread_cpu};
use crate::workloads::{Api, Conn, ConnOpts, Ctx, KvWorker, Transport, WorkerId, Workload};

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
        client: CompetitorClient,
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
    /// Most data-plane connections one long read is striped over (1: never).
    #[serde(default = "default_read_stripes")]
    pub read_stripes: usize,
}

fn default_read_stripes() -> usize {
    kvtier_client::wire::MAX_STRIPES
}

pub(super) fn workers_of(load: Load) -> u32 {
    match load {
        Load::Closed(n) => n,
        Load::Open { pool, .. } => pool,
    }
}

/// Runs one process's share of a repeat in the current runtime.
pub(super) async fn local_repeat(
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
                // One data-plane connection per worker, like the Redis competitor;
                // a prefix read gets one per stripe.
                data_connections: n as usize
                    * if spec.workload == Workload::PrefixRead {
                        spec.read_stripes.max(1)
                    } else {
                        1
                    },
                read_stripes: spec.read_stripes,
                long_reads: spec.workload == Workload::PrefixRead,
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
/// wait for a line on stdin, run, print the [`ChildReport`] JSON on one line.
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
    println!("{}", serde_json::to_string(&ChildReport::from_input(&r))?);
    Ok(())
}
