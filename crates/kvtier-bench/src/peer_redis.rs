//! The Redis peer: the same workload, payload sizes and concurrency against
//! Redis (`GET` for reads, `SET` for writes, `EXISTS k1..kn` for chain lookups).
//!
//! Client: the `redis` crate with Tokio, **one connection per worker** (a
//! multiplexed connection used by one task only, so no pipelining across
//! workers — what `redis-benchmark -c N` does). Writes overwrite one of
//! [`PEER_WRITE_SLOTS`] keys so Redis memory stays bounded (a Redis `SET` of
//! an existing key is a full write). `redis://spawn` starts a private
//! `redis-server` (no persistence) on a free loopback port.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use crate::load::{Sample, Unit};
use crate::workloads::{
    BLOCK_TOKENS, CHAIN_BLOCKS, CONV_BLOCKS, CONVERSATIONS, Ctx, KV_KEYS, PEER_WRITE_SLOTS,
    TIMEOUT, WorkerId, Workload, mix,
};

/// A `redis-server` this run started; killed on drop.
pub struct SpawnedRedis {
    child: Child,
    /// `redis://127.0.0.1:PORT`
    pub url: String,
}

impl SpawnedRedis {
    /// Starts `redis-server` without persistence on a free loopback port.
    pub fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (is it installed? apt-get install redis-server)")?;
        let s = SpawnedRedis {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(s)
    }
}

impl Drop for SpawnedRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `redis-server` can be started here.
pub fn redis_server_available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One connection to `url`.
pub async fn connect(url: &str) -> anyhow::Result<MultiplexedConnection> {
    let client = redis::Client::open(url).with_context(|| format!("redis url {url}"))?;
    let cfg = AsyncConnectionConfig::new()
        .set_response_timeout(Some(TIMEOUT))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .with_context(|| format!("connecting to {url}"))
}

/// `redis <version>` from `INFO server`.
pub async fn version(conn: &mut MultiplexedConnection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map_or_else(|| "redis".to_string(), |v| format!("redis {}", v.trim()))
}

fn prefix(nonce: u64) -> String {
    format!("kvtb:{nonce:016x}")
}

fn chain_key(nonce: u64, i: usize) -> String {
    format!("{}:c:{i}", prefix(nonce))
}
fn conv_key(nonce: u64, c: usize, j: usize) -> String {
    format!("{}:v:{c}:{j}", prefix(nonce))
}
fn kv_key(nonce: u64, i: u64) -> String {
    format!("{}:kv:{i}", prefix(nonce))
}
fn write_key(nonce: u64, u: u64) -> String {
    format!("{}:w:{}", prefix(nonce), mix(u) % PEER_WRITE_SLOTS)
}

/// Writes what the workload reads.
pub async fn preload(ctx: &Ctx, conn: &mut MultiplexedConnection) -> anyhow::Result<()> {
    let n = ctx.nonce;
    let p = ctx.payload();
    let mut keys = Vec::new();
    match ctx.workload {
        Workload::Lookup | Workload::Read | Workload::Mixed => {
            keys.extend((0..CHAIN_BLOCKS).map(|i| chain_key(n, i)));
        }
        Workload::Conversation => {
            for c in 0..CONVERSATIONS {
                keys.extend((0..CONV_BLOCKS).map(|j| conv_key(n, c, j)));
            }
        }
        Workload::Kv => keys.extend((0..KV_KEYS as u64).map(|i| kv_key(n, i))),
        Workload::Write => {}
    }
    for k in keys {
        redis::cmd("SET")
            .arg(&k)
            .arg(&p[..])
            .query_async::<()>(conn)
            .await
            .context("redis preload")?;
    }
    Ok(())
}

/// One Redis worker with its own connection.
pub struct RedisWorker {
    ctx: std::sync::Arc<Ctx>,
    conn: MultiplexedConnection,
    id: WorkerId,
    seq: u64,
}

impl RedisWorker {
    /// Worker `id` with its own connection to `url`.
    pub async fn new(ctx: std::sync::Arc<Ctx>, url: &str, id: WorkerId) -> anyhow::Result<Self> {
        Ok(RedisWorker {
            ctx,
            conn: connect(url).await?,
            id,
            seq: 0,
        })
    }

    async fn exists(&mut self, keys: &[String]) -> Sample {
        let sent = Instant::now();
        let r: redis::RedisResult<i64> = redis::cmd("EXISTS")
            .arg(keys)
            .query_async(&mut self.conn)
            .await;
        Sample {
            op: "exists",
            sent,
            done: Instant::now(),
            server: None,
            bytes: 0,
            tokens: 0,
            error: r.is_err(),
        }
    }

    async fn get(&mut self, key: &str, tokens: u64) -> Sample {
        let sent = Instant::now();
        let r: redis::RedisResult<Option<Vec<u8>>> =
            redis::cmd("GET").arg(key).query_async(&mut self.conn).await;
        let done = Instant::now();
        let (error, bytes) = match r {
            Ok(Some(v)) => (false, v.len() as u64),
            _ => (true, 0),
        };
        Sample {
            op: "get",
            sent,
            done,
            server: None,
            bytes,
            tokens: if error { 0 } else { tokens },
            error,
        }
    }

    async fn set(&mut self, key: &str, tokens: u64) -> Sample {
        let p = self.ctx.payload();
        let sent = Instant::now();
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(key)
            .arg(&p[..])
            .query_async(&mut self.conn)
            .await;
        Sample {
            op: "set",
            sent,
            done: Instant::now(),
            server: None,
            bytes: p.len() as u64,
            tokens,
            error: r.is_err(),
        }
    }
}

impl Unit for RedisWorker {
    async fn run(&mut self, out: &mut Vec<Sample>) {
        let ctx = self.ctx.clone();
        let n = ctx.nonce;
        let seq = self.seq;
        self.seq += 1;
        let u = (self.id.id << 32) ^ seq;
        let bt = BLOCK_TOKENS as u64;
        let op = match ctx.workload {
            Workload::Mixed => {
                [Workload::Lookup, Workload::Read, Workload::Write][(seq % 3) as usize]
            }
            w => w,
        };
        match op {
            Workload::Lookup => {
                let keys: Vec<String> = (0..CHAIN_BLOCKS).map(|i| chain_key(n, i)).collect();
                out.push(self.exists(&keys).await);
            }
            Workload::Read => {
                let k = chain_key(n, (mix(u) % CHAIN_BLOCKS as u64) as usize);
                out.push(self.get(&k, bt).await);
            }
            Workload::Write => out.push(self.set(&write_key(n, u), bt).await),
            Workload::Conversation => {
                let c = (u % CONVERSATIONS as u64) as usize;
                let keys: Vec<String> = (0..CONV_BLOCKS).map(|j| conv_key(n, c, j)).collect();
                for _ in 0..7 {
                    out.push(self.exists(&keys).await);
                }
                for k in &keys {
                    out.push(self.get(k, bt).await);
                }
                for j in 0..3 {
                    out.push(self.set(&write_key(n, u.wrapping_mul(4) + j), bt).await);
                }
            }
            Workload::Kv => {
                if seq.is_multiple_of(2) {
                    out.push(self.get(&kv_key(n, mix(u) % KV_KEYS as u64), 0).await);
                } else {
                    out.push(self.set(&write_key(n, u), 0).await);
                }
            }
            Workload::Mixed => unreachable!(),
        }
    }
}
