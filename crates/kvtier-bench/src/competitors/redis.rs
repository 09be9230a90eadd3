//! The Redis competitor: the same workload, payload sizes and concurrency against
//! Redis (`GET` for reads, `SET` for writes, `EXISTS k1..kn` for chain lookups).
//!
//! Client: **one connection per worker**, one request at a time (what
//! `redis-benchmark -c N` does). By default a minimal hand-written RESP2
//! client ([`crate::competitors::resp`]); `--competitor-client redis-rs` uses the `redis` crate
//! (a multiplexed connection used by one task only), which measured as the
//! bottleneck for MB-sized values (`notes/006-data-plane.md`).
//!
//! Writes store a **new key every time**, as kvtier's writes do (its blocks
//! are immutable, so a kvtier write is always a new block): both systems then
//! fill their memory and evict to stay under their limit, and both pay for
//! fresh memory and eviction alike. (Overwriting a few hot keys instead would
//! let Redis reuse the same already-faulted buffers while kvtier stores new
//! blocks: on this VM a first-touch 1.2 MB buffer costs ~0.5 ms of page faults,
//! so that comparison measured the workloads, not the systems.) The competitor must
//! therefore bound its memory: [`preload`] refuses a Redis without
//! `maxmemory` and an `allkeys-*` eviction policy. `redis://spawn` starts a
//! private `redis-server` (no persistence, `allkeys-lru`, 2 GiB: kvtier's
//! default memory tier) on a free loopback port; give a kvtier server under
//! test the same memory capacity as the Redis it is compared with.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};

use crate::competitors::resp::{Reply, Resp};
use crate::load::{Sample, Unit};
use crate::workloads::{
    BLOCK_TOKENS, CHAIN_BLOCKS, CONV_BLOCKS, CONVERSATIONS, Ctx, KV_KEYS, TIMEOUT, WorkerId,
    Workload, mix,
};

/// A `redis-server` this run started; killed on drop.
pub struct SpawnedRedis {
    child: Child,
    /// `redis://127.0.0.1:PORT`
    pub url: String,
}

impl SpawnedRedis {
    /// Starts `redis-server` without persistence on a free loopback port,
    /// on the CPUs `cpus` (a `taskset -c` list) when given.
    pub fn start(cpus: Option<&str>) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = pinned(cpus, "redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            // The same budget as kvtier's default memory tier (2 GiB).
            .args(["--maxmemory", "2gb", "--maxmemory-policy", "allkeys-lru"])
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

/// `program`, or `taskset -c CPUS program` when `cpus` is given.
pub fn pinned(cpus: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match cpus {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(c).arg(program);
            cmd
        }
        None => Command::new(program),
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

/// Which client library drives the competitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompetitorClient {
    /// The hand-written RESP2 client ([`crate::competitors::resp`]).
    #[default]
    Resp,
    /// The `redis` crate (multiplexed connection, one task per connection).
    RedisRs,
}

impl CompetitorClient {
    /// Parses `resp` / `redis-rs`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "resp" => Ok(CompetitorClient::Resp),
            "redis-rs" | "redis" => Ok(CompetitorClient::RedisRs),
            _ => anyhow::bail!("unknown competitor client {s:?}: expected resp or redis-rs"),
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            CompetitorClient::Resp => "resp",
            CompetitorClient::RedisRs => "redis-rs",
        }
    }
}

/// One competitor connection.
pub enum CompetitorConn {
    /// Hand-written RESP2.
    Resp(Resp),
    /// The `redis` crate.
    RedisRs(MultiplexedConnection),
}

/// One connection to `url` with `client`.
pub async fn connect(url: &str, client: CompetitorClient) -> anyhow::Result<CompetitorConn> {
    match client {
        CompetitorClient::Resp => Ok(CompetitorConn::Resp(
            Resp::connect(url)
                .await
                .with_context(|| format!("connecting to {url}"))?,
        )),
        CompetitorClient::RedisRs => {
            let c = redis::Client::open(url).with_context(|| format!("redis url {url}"))?;
            let cfg = AsyncConnectionConfig::new()
                .set_response_timeout(Some(TIMEOUT))
                .set_connection_timeout(Some(Duration::from_secs(5)));
            Ok(CompetitorConn::RedisRs(
                c.get_multiplexed_async_connection_with_config(&cfg)
                    .await
                    .with_context(|| format!("connecting to {url}"))?,
            ))
        }
    }
}

/// What one command answered: an integer, a bulk length, or nothing.
enum Got {
    Ok,
    Int(i64),
    Bulk(Option<usize>),
}

impl CompetitorConn {
    /// One command; errors (including `-ERR` replies) as `Err`.
    async fn cmd(&mut self, args: &[&[u8]]) -> anyhow::Result<Got> {
        match self {
            CompetitorConn::Resp(c) => {
                let r = tokio::time::timeout(TIMEOUT, c.cmd(args))
                    .await
                    .context("redis: no answer in time")??;
                Ok(match r {
                    Reply::Error(e) => anyhow::bail!("redis: {e}"),
                    Reply::Int(n) => Got::Int(n),
                    Reply::Bulk(n) => Got::Bulk(n),
                    Reply::Simple(_) | Reply::Array(_) => Got::Ok,
                })
            }
            CompetitorConn::RedisRs(c) => {
                let mut cmd = redis::cmd(std::str::from_utf8(args[0])?);
                for a in &args[1..] {
                    cmd.arg(*a);
                }
                let v: redis::Value = cmd.query_async(c).await?;
                Ok(match v {
                    redis::Value::Int(n) => Got::Int(n),
                    redis::Value::BulkString(b) => Got::Bulk(Some(b.len())),
                    redis::Value::Nil => Got::Bulk(None),
                    _ => Got::Ok,
                })
            }
        }
    }

    /// The last bulk reply as text (RESP client only; used for INFO).
    async fn text(&mut self, args: &[&[u8]]) -> String {
        match self {
            CompetitorConn::Resp(c) => match c.cmd(args).await {
                Ok(Reply::Bulk(Some(_))) => String::from_utf8_lossy(c.value()).into_owned(),
                _ => String::new(),
            },
            CompetitorConn::RedisRs(c) => {
                let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap_or("INFO"));
                for a in &args[1..] {
                    cmd.arg(*a);
                }
                cmd.query_async::<String>(c).await.unwrap_or_default()
            }
        }
    }
}

/// `redis <version>` from `INFO server`.
pub async fn version(conn: &mut CompetitorConn) -> String {
    let info = conn.text(&[b"INFO", b"server"]).await;
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
    format!("{}:w:{u:x}", prefix(nonce))
}

/// Fails unless Redis bounds its memory by evicting any key (`maxmemory` set,
/// policy `allkeys-*`): the competitor's writes store new keys without end.
pub fn check_bounded(info_memory: &str) -> anyhow::Result<()> {
    let field = |name: &str| {
        info_memory
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let max: u64 = field("maxmemory")
        .and_then(|v| v.parse().ok())
        .context("redis INFO memory has no maxmemory field")?;
    let policy = field("maxmemory_policy").unwrap_or("");
    anyhow::ensure!(
        max > 0 && policy.starts_with("allkeys-"),
        "the Redis competitor has maxmemory {max} and policy {policy:?}: this workload writes a new \
         key per request, so Redis must bound its memory and evict any key \
         (redis-server --maxmemory 2gb --maxmemory-policy allkeys-lru; redis://spawn does this)"
    );
    Ok(())
}

/// Writes what the workload reads; checks that Redis bounds its memory when
/// the workload writes.
pub async fn preload(ctx: &Ctx, conn: &mut CompetitorConn) -> anyhow::Result<()> {
    if matches!(
        ctx.workload,
        Workload::Write | Workload::Mixed | Workload::Conversation | Workload::Kv
    ) {
        check_bounded(&conn.text(&[b"INFO", b"memory"]).await)?;
    }
    let n = ctx.nonce;
    let p = ctx.payload();
    let mut keys = Vec::new();
    match ctx.workload {
        Workload::Lookup | Workload::Read | Workload::Mixed | Workload::LookupPing => {
            keys.extend((0..CHAIN_BLOCKS).map(|i| chain_key(n, i)));
        }
        Workload::Conversation => {
            for c in 0..CONVERSATIONS {
                keys.extend((0..CONV_BLOCKS).map(|j| conv_key(n, c, j)));
            }
        }
        Workload::Kv => keys.extend((0..KV_KEYS as u64).map(|i| kv_key(n, i))),
        // prefix-read has no competitor implementation (the sweep refuses it with competitors).
        Workload::Write | Workload::Ping | Workload::PrefixRead => {}
    }
    for k in keys {
        conn.cmd(&[b"SET", k.as_bytes(), &p[..]])
            .await
            .context("redis preload")?;
    }
    Ok(())
}

/// One Redis worker with its own connection.
pub struct RedisWorker {
    ctx: std::sync::Arc<Ctx>,
    conn: CompetitorConn,
    id: WorkerId,
    seq: u64,
}

impl RedisWorker {
    /// Worker `id` with its own connection to `url`.
    pub async fn new(
        ctx: std::sync::Arc<Ctx>,
        url: &str,
        client: CompetitorClient,
        id: WorkerId,
    ) -> anyhow::Result<Self> {
        Ok(RedisWorker {
            ctx,
            conn: connect(url, client).await?,
            id,
            seq: 0,
        })
    }

    async fn simple(&mut self, op: &'static str, args: &[&[u8]]) -> Sample {
        let sent = Instant::now();
        let r = self.conn.cmd(args).await;
        Sample {
            op,
            sent,
            done: Instant::now(),
            server: None,
            bytes: 0,
            tokens: 0,
            error: r.is_err(),
            shed: None,
        }
    }

    async fn exists(&mut self, keys: &[String]) -> Sample {
        let mut args: Vec<&[u8]> = Vec::with_capacity(keys.len() + 1);
        args.push(b"EXISTS");
        args.extend(keys.iter().map(|k| k.as_bytes()));
        let sent = Instant::now();
        let r = self.conn.cmd(&args).await;
        Sample {
            op: "exists",
            sent,
            done: Instant::now(),
            server: None,
            bytes: 0,
            tokens: 0,
            error: !matches!(r, Ok(Got::Int(n)) if n == keys.len() as i64),
            shed: None,
        }
    }

    async fn get(&mut self, key: &str, tokens: u64) -> Sample {
        let sent = Instant::now();
        let r = self.conn.cmd(&[b"GET", key.as_bytes()]).await;
        let done = Instant::now();
        let (error, bytes) = match r {
            Ok(Got::Bulk(Some(n))) => (false, n as u64),
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
            shed: None,
        }
    }

    async fn set(&mut self, key: &str, tokens: u64) -> Sample {
        let p = self.ctx.payload();
        let sent = Instant::now();
        let r = self.conn.cmd(&[b"SET", key.as_bytes(), &p[..]]).await;
        Sample {
            op: "set",
            sent,
            done: Instant::now(),
            server: None,
            bytes: p.len() as u64,
            tokens,
            error: r.is_err(),
            shed: None,
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
            Workload::LookupPing => [Workload::Lookup, Workload::Ping][(seq % 2) as usize],
            w => w,
        };
        match op {
            Workload::Lookup => {
                let keys: Vec<String> = (0..CHAIN_BLOCKS).map(|i| chain_key(n, i)).collect();
                out.push(self.exists(&keys).await);
            }
            Workload::Ping => out.push(self.simple("ping", &[b"PING"]).await),
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
            Workload::Mixed | Workload::LookupPing | Workload::PrefixRead => unreachable!(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_bounded;

    #[test]
    fn an_unbounded_or_non_evicting_redis_is_refused() {
        let ok =
            "# Memory\r\nused_memory:1\r\nmaxmemory:4294967296\r\nmaxmemory_policy:allkeys-lru\r\n";
        check_bounded(ok).unwrap();
        let unbounded = ok.replace("maxmemory:4294967296", "maxmemory:0");
        let e = check_bounded(&unbounded).unwrap_err().to_string();
        assert!(e.contains("maxmemory 0"), "{e}");
        let volatile = ok.replace("allkeys-lru", "volatile-lru");
        assert!(check_bounded(&volatile).is_err());
        let noeviction = ok.replace("allkeys-lru", "noeviction");
        assert!(check_bounded(&noeviction).is_err());
        assert!(check_bounded("garbage").is_err());
    }
}
