//! Workloads (what one unit of work is) against kvtier's two gRPC APIs.
//!
//! | workload | unit | ops |
//! |---|---|---|
//! | `lookup` | one lookup of a 64-block chain (preloaded) | `lookup` |
//! | `read` | one read of one block of that chain | `read` |
//! | `write` | one write of a new block | `write` |
//! | `mixed` | lookup, read, write in turn (seed 000) | all three |
//! | `conversation` | 7 lookups + 6 reads + 3 writes of 128-token blocks (seed 001) | all three |
//! | `kv` | 100-byte get / set in turn with text keys, `kvtier.v1` only (seed 004) | `get`, `set` |
//! | `ping` | one empty gRPC round trip (`grpc.health.v1.Health/Check`; Redis `PING`) | `ping` |
//! | `lookup-ping` | `lookup` and `ping` in turn: lookup latency next to an empty round trip | `lookup`, `ping` |
//! | `prefix-read` | one lookup + one read of a whole 256-block prefix (preloaded), as an engine loading a 32k-token prompt; `v1` only | `prefix-read` |
//!
//! Everything a unit touches is derived from the run's `nonce`, so child
//! processes find the preloaded data without being told more than the nonce.
//! Blocks are 128 tokens: reads and writes count 128 tokens each, lookups none
//! (seed 001: tokens/s = (reads + writes) × 128).
//!
//! The parts: `options` (workload, API, transport), `ctx` (the run's data:
//! naming, preload, discovery), `conn` (connecting), and one worker per API,
//! `v1` and `kvstore`. This file holds what they share: the sizes above, the
//! deterministic naming of tokens and keys, which operation each unit is, and
//! [`KvWorker`], the worker the load loops drive.

use std::time::{Duration, Instant};

use kvtier_core::Key;

use crate::load::{Sample, Unit};

mod conn;
mod ctx;
mod kvstore;
mod options;
mod v1;

pub use conn::{Conn, ConnOpts, V1Client, target_addrs};
pub use ctx::Ctx;
pub use kvstore::KvStoreWorker;
pub use options::{Api, Transport, Workload};
pub use v1::V1Worker;

use conn::{HealthClient, kvstore_client};

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 128;
/// Blocks in the preloaded chain (lookups check all of it; reads pick one).
pub const CHAIN_BLOCKS: usize = 64;
/// Blocks in the long prefix `prefix-read` loads (32k tokens; ~300 MB at the
/// default 1.2 MB per block).
pub const PREFIX_BLOCKS: usize = 256;
/// Conversations preloaded for the `conversation` workload.
pub const CONVERSATIONS: usize = 16;
/// Cached blocks per conversation (the 6 reads of an iteration).
pub const CONV_BLOCKS: usize = 6;
/// Keys preloaded for `kv` gets.
pub const KV_KEYS: usize = 1000;
/// Deadline per request.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of a `prefix-read` (~300 MB: 20 s at 120 Mbit/s; a slow link
/// must show as a slow read, not as a deadline error).
pub const PREFIX_TIMEOUT: Duration = Duration::from_secs(300);

/// splitmix64: cheap deterministic pseudo-random numbers.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `n` tokens of stream `stream` (non-negative, below 2^31).
pub fn tokens(nonce: u64, stream: u64, n: usize) -> Vec<u32> {
    let seed = mix(nonce ^ mix(stream));
    (0..n as u64)
        .map(|i| (mix(seed.wrapping_add(i)) >> 33) as u32)
        .collect()
}

/// The identity of one worker: unique across processes, repeats and steps.
#[derive(Debug, Clone, Copy)]
pub struct WorkerId {
    /// Run nonce.
    pub nonce: u64,
    /// Unique worker number in the run.
    pub id: u64,
}

impl WorkerId {
    fn unique(&self, seq: u64) -> u64 {
        (self.id << 32) ^ seq
    }
}

fn stream_chain() -> u64 {
    1
}
fn stream_prefix() -> u64 {
    2
}
fn stream_conv(c: usize) -> u64 {
    1000 + c as u64
}
fn stream_write(u: u64) -> u64 {
    1 << 62 | u
}

fn block_hash(nonce: u64, stream: u64, i: usize) -> u64 {
    mix(nonce ^ mix(stream) ^ mix(i as u64 + 7)) | 1
}

fn kv_key(nonce: u64, i: u64) -> Key {
    Key::new(format!("kv:{nonce:016x}:{i}").into_bytes()).expect("short key")
}

fn kv_set_key(nonce: u64, u: u64) -> Key {
    Key::new(format!("kv:{nonce:016x}:s:{u:x}").into_bytes()).expect("short key")
}

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(TIMEOUT);
    r
}

/// One kvtier worker (one closed-loop task / one open-loop pool slot), of
/// the API its connection speaks.
pub enum KvWorker {
    /// `kvtier.v1` through the Rust client.
    V1(V1Worker),
    /// The seed's `kvstore.KVStoreService`.
    KvStore(KvStoreWorker),
}

impl KvWorker {
    /// Worker `id` on `conn`.
    pub fn new(ctx: std::sync::Arc<Ctx>, conn: &Conn, id: WorkerId) -> Self {
        match conn {
            Conn::V1(c, h) => KvWorker::V1(V1Worker {
                ctx,
                client: c.clone(),
                health: (!h.is_empty())
                    .then(|| HealthClient::new(h[id.id as usize % h.len()].clone())),
                id,
                seq: 0,
            }),
            Conn::KvStore(ch) => KvWorker::KvStore(KvStoreWorker {
                ctx,
                client: kvstore_client(ch[id.id as usize % ch.len()].clone()),
                id,
                seq: 0,
            }),
        }
    }
}

/// What one unit of a workload does (a mixed workload alternates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Lookup,
    Read,
    Write,
    Ping,
    Conversation,
    Kv,
    PrefixRead,
}

impl Op {
    /// Unit `seq` of worker `id`: its operation, its unique number and the
    /// chain block it reads.
    fn next(ctx: &Ctx, id: WorkerId, seq: u64) -> (Op, u64, usize) {
        let u = id.unique(seq);
        let pick = (mix(u) % CHAIN_BLOCKS as u64) as usize;
        (Op::of(ctx.workload, seq), u, pick)
    }

    /// The operation of unit `seq` of `workload`.
    fn of(workload: Workload, seq: u64) -> Op {
        match workload {
            Workload::Mixed => [Op::Lookup, Op::Read, Op::Write][(seq % 3) as usize],
            Workload::LookupPing => [Op::Lookup, Op::Ping][(seq % 2) as usize],
            Workload::Lookup => Op::Lookup,
            Workload::Read => Op::Read,
            Workload::Write => Op::Write,
            Workload::Ping => Op::Ping,
            Workload::Conversation => Op::Conversation,
            Workload::Kv => Op::Kv,
            Workload::PrefixRead => Op::PrefixRead,
        }
    }
}

fn sample(op: &'static str, sent: Instant) -> Sample {
    Sample {
        op,
        sent,
        done: Instant::now(),
        server: None,
        bytes: 0,
        tokens: 0,
        error: true,
        shed: None,
    }
}

impl Unit for KvWorker {
    async fn run(&mut self, out: &mut Vec<Sample>) {
        match self {
            KvWorker::V1(w) => {
                w.unit(out).await;
                w.seq += 1;
            }
            KvWorker::KvStore(w) => {
                w.unit(out).await;
                w.seq += 1;
            }
        }
    }
}
