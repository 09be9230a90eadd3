//! Start-up of the systems a sweep measures: the system under test
//! ([`Target`]: `--target`, or an in-process server on its own runtime) and
//! every `--competitor` ([`start_peers`]: a Redis this run spawns or is given, or a
//! spawned Mooncake Store). Spawned systems stop when dropped or stopped.

use super::worker::System;
use super::{BenchConfig, COMPETITOR_MEMORY};
use crate::competitors::CompetitorSpec;
use crate::competitors::mooncake::SpawnedMooncake;
use crate::competitors::redis::SpawnedRedis;
use crate::load::cores;
use crate::netobs::Sel;
use crate::workloads::Workload;

/// A competitor of this run.
pub(super) enum Competitor {
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

impl Competitor {
    pub(super) fn name(&self) -> String {
        match self {
            Competitor::Bench { name, .. } => name.clone(),
            Competitor::Mooncake(m) => m.name(),
        }
    }
}

pub(super) fn port_of(url: &str) -> Option<u16> {
    url.rsplit(':').next()?.trim_end_matches('/').parse().ok()
}

/// The system under test: `--target`, or a server started in this process
/// on its own runtime (threads `kvtier-srv`).
pub(super) struct Target {
    /// Address the clients dial.
    pub(super) addr: String,
    /// What the record says.
    pub(super) desc: String,
    spawned: Option<(tokio::runtime::Runtime, kvtier_server::Server)>,
}

impl Target {
    pub(super) fn start(cfg: &BenchConfig) -> anyhow::Result<Self> {
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

    pub(super) fn stop(self) -> anyhow::Result<()> {
        if let Some((srv_rt, server)) = self.spawned {
            srv_rt.block_on(server.shutdown())?;
        }
        Ok(())
    }
}

/// Starts (or names) every `--competitor`; Redis competitors get their names once connected.
pub(super) fn start_peers(cfg: &BenchConfig) -> anyhow::Result<Vec<Competitor>> {
    let mut competitors = Vec::new();
    for p in &cfg.competitors {
        let (url, spawned) = match p {
            CompetitorSpec::RedisSpawn => {
                let r = SpawnedRedis::start(cfg.competitor_cpus.as_deref())?;
                (r.url.clone(), Some(r))
            }
            CompetitorSpec::MooncakeSpawn => {
                anyhow::ensure!(
                    cfg.rates.is_empty()
                        && matches!(cfg.workload, Workload::Read | Workload::Write),
                    "the Mooncake competitor runs closed-loop --workload read or write"
                );
                competitors.push(Competitor::Mooncake(SpawnedMooncake::start(
                    COMPETITOR_MEMORY,
                    cfg.competitor_cpus.as_deref(),
                )?));
                continue;
            }
            CompetitorSpec::Redis(url) => (url.clone(), None),
        };
        competitors.push(Competitor::Bench {
            name: String::new(),
            client: format!(
                "kvtier bench's Redis client ({})",
                cfg.competitor_client.name()
            ),
            sockets: Sel {
                ports: port_of(&url).into_iter().collect(),
                pids: Vec::new(),
            },
            system: System::Redis {
                url: url.clone(),
                client: cfg.competitor_client,
            },
            url,
            _spawned: spawned,
        });
    }
    Ok(competitors)
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
