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
//!
//! Everything a unit touches is derived from the run's `nonce`, so child
//! processes find the preloaded data without being told more than the nonce.
//! Blocks are 128 tokens: reads and writes count 128 tokens each, lookups none
//! (seed 001: tokens/s = (reads + writes) × 128).

use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_proto::kvstore as pb;
use kvtier_proto::kvstore::kv_store_service_client::KvStoreServiceClient;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::load::{Sample, ServerTimes, Unit};

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 128;
/// Blocks in the preloaded chain (lookups check all of it; reads pick one).
pub const CHAIN_BLOCKS: usize = 64;
/// Conversations preloaded for the `conversation` workload.
pub const CONVERSATIONS: usize = 16;
/// Cached blocks per conversation (the 6 reads of an iteration).
pub const CONV_BLOCKS: usize = 6;
/// Keys preloaded for `kv` gets.
pub const KV_KEYS: usize = 1000;
/// Deadline per request.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// What one unit of work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// 64-block chain lookups.
    Lookup,
    /// Single-block reads.
    Read,
    /// Single-block writes.
    Write,
    /// Lookup, read, write in turn.
    Mixed,
    /// Seed 001's iteration.
    Conversation,
    /// 100-byte get/set (v1 only).
    Kv,
    /// Empty round trips (health check).
    Ping,
    /// Lookup and ping in turn.
    LookupPing,
}

impl Workload {
    /// Parses a workload name.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "lookup" => Workload::Lookup,
            "read" => Workload::Read,
            "write" => Workload::Write,
            "mixed" => Workload::Mixed,
            "conversation" => Workload::Conversation,
            "kv" => Workload::Kv,
            "ping" => Workload::Ping,
            "lookup-ping" => Workload::LookupPing,
            _ => anyhow::bail!(
                "unknown workload {s:?}: expected lookup, read, write, mixed, conversation, kv, \
                 ping or lookup-ping"
            ),
        })
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lookup => "lookup",
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::Mixed => "mixed",
            Workload::Conversation => "conversation",
            Workload::Kv => "kv",
            Workload::Ping => "ping",
            Workload::LookupPing => "lookup-ping",
        }
    }

    /// Default payload per block: 1.2 MB (seed 000), 512 B for `conversation`
    /// (seed 001), 100 B for `kv` (seed 004).
    pub fn default_value_size(self) -> u64 {
        match self {
            Workload::Conversation => 512,
            Workload::Kv => 100,
            _ => 1_200_000,
        }
    }
}

/// Which kvtier API is exercised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `kvtier.v1` through the Rust client.
    V1,
    /// `kvstore.KVStoreService` (the seed's API) through a tonic client.
    Compat,
}

impl Api {
    /// Parses `v1` / `compat`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "v1" | "grpc" => Ok(Api::V1),
            "compat" | "kvstore" => Ok(Api::Compat),
            _ => anyhow::bail!("unknown api {s:?}: expected v1 or compat"),
        }
    }

    /// The record's `api` string: `v1+grpc` / `v1+wire` (Read and Write over
    /// the data plane, the rest over gRPC) / `kvstore-compat`.
    pub fn record_name(self, wire: bool) -> &'static str {
        match (self, wire) {
            (Api::V1, false) => "v1+grpc",
            (Api::V1, true) => "v1+wire",
            (Api::Compat, _) => "kvstore-compat",
        }
    }
}

/// How `kvtier.v1` Read/Write travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// The data plane when the server advertises one, else gRPC.
    #[default]
    Auto,
    /// gRPC only (`ClientConfig::data_plane = false`).
    Grpc,
    /// The data plane; an error when the server has none.
    DataPlane,
}

impl Transport {
    /// Parses `auto` / `grpc` / `data-plane` (`wire`).
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "auto" => Ok(Transport::Auto),
            "grpc" => Ok(Transport::Grpc),
            "data-plane" | "wire" => Ok(Transport::DataPlane),
            _ => anyhow::bail!("unknown transport {s:?}: expected auto, grpc or data-plane"),
        }
    }
}

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

/// Shared, read-only state of a workload in one process.
pub struct Ctx {
    /// The workload.
    pub workload: Workload,
    /// Payload bytes per block.
    pub value_size: usize,
    /// Run nonce.
    pub nonce: u64,
    payload: Bytes,
    ns: String,
    resource: String,
    container: String,
    chain_keys: Vec<Key>,
    conv_keys: Vec<Vec<Key>>,
    chain_locs: Vec<String>,
}

fn stream_chain() -> u64 {
    1
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

impl Ctx {
    /// Deterministic state for `nonce`; [`Ctx::preload`] writes it, [`Ctx::discover`] finds it.
    pub fn new(workload: Workload, value_size: usize, nonce: u64) -> Self {
        let mut p = vec![0u8; value_size];
        for (i, chunk) in p.chunks_mut(8).enumerate() {
            let v = mix(nonce ^ i as u64).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ctx {
            workload,
            value_size,
            nonce,
            payload: Bytes::from(p),
            ns: format!("bench/{nonce:016x}"),
            resource: "bench".into(),
            container: format!("c{nonce:016x}"),
            chain_keys: Vec::new(),
            conv_keys: Vec::new(),
            chain_locs: Vec::new(),
        }
    }

    /// The payload every write sends.
    pub fn payload(&self) -> Bytes {
        self.payload.clone()
    }

    fn needs_chain(&self) -> bool {
        matches!(
            self.workload,
            Workload::Lookup | Workload::Read | Workload::Mixed | Workload::LookupPing
        )
    }

    /// Writes what the workload reads (once per run, by the parent).
    pub async fn preload(&mut self, conn: &Conn) -> anyhow::Result<()> {
        let n = self.nonce;
        match conn {
            Conn::V1(c, _) => {
                if self.needs_chain() {
                    let t = tokens(n, stream_chain(), CHAIN_BLOCKS * BLOCK_TOKENS);
                    let keys = c.keys_for(&t);
                    for (i, k) in keys.iter().enumerate() {
                        let b = WriteBlock {
                            key: k.clone(),
                            parent: i.checked_sub(1).map(|p| keys[p].clone()),
                            token_count: BLOCK_TOKENS as u32,
                            payload: self.payload.clone(),
                            ttl_ms: 0,
                        };
                        c.write(&self.ns, &[b]).await.context("preload chain")?;
                    }
                }
                if self.workload == Workload::Conversation {
                    for conv in 0..CONVERSATIONS {
                        let t = tokens(n, stream_conv(conv), CONV_BLOCKS * BLOCK_TOKENS);
                        let payloads = vec![self.payload.clone(); CONV_BLOCKS];
                        c.write_tokens(&self.ns, &t, &payloads)
                            .await
                            .context("preload conversations")?;
                    }
                }
                if self.workload == Workload::Kv {
                    for chunk in (0..KV_KEYS as u64).collect::<Vec<_>>().chunks(100) {
                        let blocks: Vec<WriteBlock> = chunk
                            .iter()
                            .map(|i| WriteBlock {
                                key: kv_key(n, *i),
                                parent: None,
                                token_count: 0,
                                payload: self.payload.clone(),
                                ttl_ms: 0,
                            })
                            .collect();
                        c.write(&self.ns, &blocks).await.context("preload kv")?;
                    }
                }
            }
            Conn::Compat(chans) => {
                anyhow::ensure!(
                    self.workload != Workload::Kv,
                    "the kv workload needs --api v1 (the kvstore API has no text keys)"
                );
                let mut c = compat_client(chans[0].clone());
                let mut write_chain = async |stream: u64, blocks: usize| -> anyhow::Result<()> {
                    let t = tokens(n, stream, blocks * BLOCK_TOKENS);
                    let mut parent = 0;
                    for (i, toks) in t.chunks(BLOCK_TOKENS).enumerate() {
                        let hash = block_hash(n, stream, i);
                        let r = c
                            .write(pb::WriteRequest {
                                resource_name: self.resource.clone(),
                                container_name: self.container.clone(),
                                chunk: Some(pb::PromptChunk {
                                    hash,
                                    parent_hash: parent,
                                    buffer: self.payload.clone(),
                                    tokens: toks.iter().map(|x| i64::from(*x)).collect(),
                                    ..Default::default()
                                }),
                            })
                            .await?
                            .into_inner();
                        anyhow::ensure!(r.success, "preload write failed: {}", r.error);
                        parent = hash;
                    }
                    Ok(())
                };
                if self.needs_chain() {
                    write_chain(stream_chain(), CHAIN_BLOCKS).await?;
                }
                if self.workload == Workload::Conversation {
                    for conv in 0..CONVERSATIONS {
                        write_chain(stream_conv(conv), CONV_BLOCKS).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Finds the preloaded data (keys, compat locations) without writing.
    pub async fn discover(&mut self, conn: &Conn) -> anyhow::Result<()> {
        let n = self.nonce;
        match conn {
            Conn::V1(c, _) => {
                self.chain_keys =
                    c.keys_for(&tokens(n, stream_chain(), CHAIN_BLOCKS * BLOCK_TOKENS));
                self.conv_keys = (0..CONVERSATIONS)
                    .map(|conv| {
                        c.keys_for(&tokens(n, stream_conv(conv), CONV_BLOCKS * BLOCK_TOKENS))
                    })
                    .collect();
            }
            Conn::Compat(chans) => {
                if self.needs_chain() {
                    let mut c = compat_client(chans[0].clone());
                    let r = c
                        .lookup(self.compat_lookup(stream_chain(), CHAIN_BLOCKS))
                        .await?
                        .into_inner();
                    anyhow::ensure!(
                        r.success && r.locations.len() == CHAIN_BLOCKS,
                        "preloaded chain not found ({} of {CHAIN_BLOCKS} blocks; {})",
                        r.locations.len(),
                        r.error
                    );
                    self.chain_locs = r.locations.into_iter().map(|l| l.location).collect();
                }
            }
        }
        Ok(())
    }

    fn compat_lookup(&self, stream: u64, blocks: usize) -> pb::LookupRequest {
        pb::LookupRequest {
            resource_name: self.resource.clone(),
            container_name: self.container.clone(),
            tokens: tokens(self.nonce, stream, blocks * BLOCK_TOKENS)
                .into_iter()
                .map(i64::from)
                .collect(),
            ..Default::default()
        }
    }
}

/// A connection (pool) to the system under test, shared by a process's workers.
#[derive(Clone)]
pub enum Conn {
    /// The Rust client (its own pool of HTTP/2 connections, and of data-plane
    /// connections when used) and, for pings, tuned tonic channels.
    V1(Box<Client>, Vec<Channel>),
    /// Tuned tonic channels; worker i uses channel i mod n.
    Compat(Vec<Channel>),
}

/// How to connect to kvtier.
#[derive(Debug, Clone)]
pub struct ConnOpts {
    /// API.
    pub api: Api,
    /// HTTP/2 connections.
    pub connections: usize,
    /// Read/Write transport (v1).
    pub transport: Transport,
    /// Data-plane connections (one request in flight each; 0: `connections`).
    pub data_connections: usize,
    /// Also open channels for `grpc.health.v1` pings.
    pub ping: bool,
    /// TCP congestion control of data-plane connections ("": system default).
    pub data_tcp_congestion: String,
    /// Client retries of shed requests (`None`: the client's default).
    pub retries: Option<u32>,
}

impl Conn {
    /// Connects `connections` HTTP/2 connections to `target` (`grpc://` or `http://`).
    pub async fn connect(opts: ConnOpts, target: &str) -> anyhow::Result<Self> {
        let ep = target.replacen("grpc://", "http://", 1);
        let mut cfg = ClientConfig::new(ep);
        cfg.connections = opts.connections.max(1);
        cfg.timeout = TIMEOUT;
        cfg.data_plane = opts.transport != Transport::Grpc;
        cfg.data_connections = opts.data_connections;
        // "" (system default) is passed on as is: the client skips empty names.
        cfg.data_tcp_congestion = Some(opts.data_tcp_congestion.clone());
        if let Some(r) = opts.retries {
            cfg.retries = r;
        }
        // A server with authentication on (docs/security.md): the token comes
        // from the environment, never from the command line (it would be in
        // the record's command line).
        cfg.token = std::env::var("KVTIER_TOKEN").ok().filter(|t| !t.is_empty());
        // TLS from $KVTIER_TLS_CA (and _CERT / _KEY), like the CLI.
        cfg.tls = kvtier_client::ClientTls::from_env()?;
        Ok(match opts.api {
            Api::V1 => {
                let c = Client::connect(cfg.clone()).await.context("connecting")?;
                anyhow::ensure!(
                    opts.transport != Transport::DataPlane || c.data_plane().is_some(),
                    "--transport data-plane: the server advertises no data plane"
                );
                let health = if opts.ping {
                    kvtier_client::connect_pool(&cfg)
                        .await
                        .context("connecting")?
                } else {
                    Vec::new()
                };
                Conn::V1(Box::new(c), health)
            }
            Api::Compat => Conn::Compat(
                kvtier_client::connect_pool(&cfg)
                    .await
                    .context("connecting")?,
            ),
        })
    }

    /// Whether Read/Write go over the data plane.
    pub fn uses_data_plane(&self) -> bool {
        matches!(self, Conn::V1(c, _) if c.data_plane().is_some())
    }

    /// The data plane's address, when Read/Write use it.
    pub fn data_plane_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Conn::V1(c, _) => c.data_plane().map(|w| w.addr()),
            _ => None,
        }
    }
}

fn compat_client(ch: Channel) -> KvStoreServiceClient<Channel> {
    KvStoreServiceClient::new(ch)
        .max_decoding_message_size(512 << 20)
        .max_encoding_message_size(512 << 20)
}

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(TIMEOUT);
    r
}

type HealthClient = tonic_health::pb::health_client::HealthClient<Channel>;

/// One kvtier worker (one closed-loop task / one open-loop pool slot), of
/// the API its connection speaks.
pub enum KvWorker {
    /// `kvtier.v1` through the Rust client.
    V1(V1Worker),
    /// The seed's `kvstore.KVStoreService`.
    Compat(CompatWorker),
}

/// A worker on `kvtier.v1`.
pub struct V1Worker {
    ctx: std::sync::Arc<Ctx>,
    client: Box<Client>,
    health: Option<HealthClient>,
    id: WorkerId,
    seq: u64,
}

/// A worker on `kvstore.KVStoreService`.
pub struct CompatWorker {
    ctx: std::sync::Arc<Ctx>,
    client: KvStoreServiceClient<Channel>,
    id: WorkerId,
    seq: u64,
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
            Conn::Compat(ch) => KvWorker::Compat(CompatWorker {
                ctx,
                client: compat_client(ch[id.id as usize % ch.len()].clone()),
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
        }
    }
}

fn v1_times(t: &kvtier_client::ServerTiming) -> ServerTimes {
    ServerTimes {
        queue_us: Some(t.queue_us),
        service_us: t.service_us,
        storage_us: t.storage_memory_us + t.storage_disk_us + t.storage_object_us,
        total_us: t.total_us,
    }
}

fn compat_times(m: Option<&pb::ServerMetrics>) -> Option<ServerTimes> {
    m.map(|m| ServerTimes {
        queue_us: None,
        service_us: m.total_latency_us.max(0) as u64,
        storage_us: m.storage_latency_us.max(0) as u64,
        total_us: m.total_latency_us.max(0) as u64,
    })
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
        shed: false,
    }
}

/// Whether a v1 call failed because the server shed it.
fn shed_v1<T>(r: &Result<T, kvtier_client::ClientError>) -> bool {
    matches!(r, Err(e) if e.code() == Some(tonic::Code::Unavailable))
}

/// Whether a kvstore call failed because the server shed it.
fn shed_compat<T>(r: &Result<T, tonic::Status>) -> bool {
    matches!(r, Err(s) if s.code() == tonic::Code::Unavailable)
}

impl V1Worker {
    async fn lookup(&mut self, keys: &[Key]) -> Sample {
        let c = &self.client;
        let sent = Instant::now();
        let r = c.lookup(&self.ctx.ns, keys, None).await;
        let mut s = sample("lookup", sent);
        s.shed = shed_v1(&r);
        if let Ok(l) = r {
            s.server = Some(v1_times(&l.timing));
            s.error = false;
        }
        s
    }

    async fn read(&mut self, op: &'static str, key: &Key) -> Sample {
        let c = &self.client;
        let sent = Instant::now();
        let r = c.read(&self.ctx.ns, std::slice::from_ref(key), 0).await;
        let mut s = sample(op, sent);
        s.shed = shed_v1(&r);
        if let Ok(r) = r {
            s.server = Some(v1_times(&r.timing));
            s.error = r.partial || r.blocks.is_empty();
            s.bytes = r.blocks.iter().map(|b| b.payload.len() as u64).sum();
            s.tokens = if op == "read" { BLOCK_TOKENS as u64 } else { 0 };
        }
        s
    }

    async fn write(&mut self, op: &'static str, key: Key, parent: Option<Key>) -> Sample {
        let c = &self.client;
        let b = WriteBlock {
            key,
            parent,
            token_count: if op == "write" {
                BLOCK_TOKENS as u32
            } else {
                0
            },
            payload: self.ctx.payload.clone(),
            ttl_ms: 0,
        };
        let sent = Instant::now();
        let r = c.write(&self.ctx.ns, &[b]).await;
        let mut s = sample(op, sent);
        s.shed = shed_v1(&r);
        if let Ok(w) = r {
            s.server = Some(v1_times(&w.timing));
            s.error = false;
            s.bytes = self.ctx.value_size as u64;
            s.tokens = if op == "write" {
                BLOCK_TOKENS as u64
            } else {
                0
            };
        }
        s
    }

    async fn ping(&mut self) -> Sample {
        let Some(h) = &mut self.health else {
            return sample("ping", Instant::now());
        };
        let sent = Instant::now();
        let r = h
            .check(req(tonic_health::pb::HealthCheckRequest::default()))
            .await;
        let mut s = sample("ping", sent);
        s.error = r.is_err();
        s
    }

    fn new_key(&self, u: u64) -> Key {
        let mut k = self.ctx.nonce.to_be_bytes().to_vec();
        k.extend_from_slice(&u.to_be_bytes());
        Key::new(k).expect("16 bytes")
    }

    async fn unit(&mut self, out: &mut Vec<Sample>) {
        let ctx = self.ctx.clone();
        let (op, u, pick) = Op::next(&ctx, self.id, self.seq);
        match op {
            Op::Ping => out.push(self.ping().await),
            Op::Lookup => out.push(self.lookup(&ctx.chain_keys).await),
            Op::Read => out.push(self.read("read", &ctx.chain_keys[pick]).await),
            Op::Write => out.push(self.write("write", self.new_key(u), None).await),
            Op::Conversation => {
                let conv = &ctx.conv_keys[(u % CONVERSATIONS as u64) as usize];
                for _ in 0..7 {
                    out.push(self.lookup(conv).await);
                }
                for k in conv {
                    out.push(self.read("read", k).await);
                }
                for j in 0..3 {
                    let key = self.new_key(u.wrapping_mul(4) + j);
                    out.push(self.write("write", key, conv.last().cloned()).await);
                }
            }
            Op::Kv => {
                if self.seq.is_multiple_of(2) {
                    let k = kv_key(ctx.nonce, mix(u) % KV_KEYS as u64);
                    out.push(self.read("get", &k).await);
                } else {
                    out.push(self.write("set", kv_set_key(ctx.nonce, u), None).await);
                }
            }
        }
    }
}

impl CompatWorker {
    async fn c_lookup(&mut self, stream: u64, blocks: usize) -> (Sample, Vec<String>) {
        let rq = self.ctx.compat_lookup(stream, blocks);
        let c = &mut self.client;
        let sent = Instant::now();
        let r = c.lookup(req(rq)).await;
        let mut s = sample("lookup", sent);
        s.shed = shed_compat(&r);
        let mut locs = Vec::new();
        if let Ok(r) = r {
            let r = r.into_inner();
            s.server = compat_times(r.server_metrics.as_ref());
            s.error = !r.success;
            locs = r.locations.into_iter().map(|l| l.location).collect();
        }
        (s, locs)
    }

    async fn c_read(&mut self, location: &str) -> Sample {
        let rq = pb::ReadRequest {
            resource_name: self.ctx.resource.clone(),
            container_name: self.ctx.container.clone(),
            location: location.to_string(),
            ..Default::default()
        };
        let c = &mut self.client;
        let sent = Instant::now();
        let r = c.read(req(rq)).await;
        let mut s = sample("read", sent);
        s.shed = shed_compat(&r);
        if let Ok(r) = r {
            let r = r.into_inner();
            s.server = compat_times(r.server_metrics.as_ref());
            s.error = !(r.success && r.found);
            s.bytes = r.chunk.map_or(0, |c| c.buffer.len() as u64);
            s.tokens = BLOCK_TOKENS as u64;
        }
        s
    }

    async fn c_write(&mut self, u: u64, parent_hash: u64) -> Sample {
        let stream = stream_write(u);
        let rq = pb::WriteRequest {
            resource_name: self.ctx.resource.clone(),
            container_name: self.ctx.container.clone(),
            chunk: Some(pb::PromptChunk {
                hash: block_hash(self.ctx.nonce, stream, 0),
                parent_hash,
                buffer: self.ctx.payload.clone(),
                tokens: tokens(self.ctx.nonce, stream, BLOCK_TOKENS)
                    .into_iter()
                    .map(i64::from)
                    .collect(),
                ..Default::default()
            }),
        };
        let c = &mut self.client;
        let sent = Instant::now();
        let r = c.write(req(rq)).await;
        let mut s = sample("write", sent);
        s.shed = shed_compat(&r);
        if let Ok(r) = r {
            let r = r.into_inner();
            s.server = compat_times(r.server_metrics.as_ref());
            s.error = !r.success;
            s.bytes = self.ctx.value_size as u64;
            s.tokens = BLOCK_TOKENS as u64;
        }
        s
    }

    async fn unit(&mut self, out: &mut Vec<Sample>) {
        let ctx = self.ctx.clone();
        let (op, u, pick) = Op::next(&ctx, self.id, self.seq);
        match op {
            Op::Lookup => out.push(self.c_lookup(stream_chain(), CHAIN_BLOCKS).await.0),
            Op::Read => out.push(self.c_read(&ctx.chain_locs[pick]).await),
            Op::Write => out.push(self.c_write(u, 0).await),
            Op::Conversation => {
                let conv = (u % CONVERSATIONS as u64) as usize;
                let mut locs = Vec::new();
                for _ in 0..7 {
                    let (s, l) = self.c_lookup(stream_conv(conv), CONV_BLOCKS).await;
                    out.push(s);
                    locs = l;
                }
                for i in 0..CONV_BLOCKS {
                    match locs.get(i) {
                        Some(l) => out.push(self.c_read(l).await),
                        None => out.push(sample("read", Instant::now())),
                    }
                }
                let last = block_hash(ctx.nonce, stream_conv(conv), CONV_BLOCKS - 1);
                for j in 0..3 {
                    out.push(self.c_write(u.wrapping_mul(4) + j, last).await);
                }
            }
            // Not offered by the seed's API (run.rs refuses these workloads
            // with --api compat); counted as failures if ever reached.
            Op::Kv | Op::Ping => out.push(sample("set", Instant::now())),
        }
    }
}

impl Unit for KvWorker {
    async fn run(&mut self, out: &mut Vec<Sample>) {
        match self {
            KvWorker::V1(w) => {
                w.unit(out).await;
                w.seq += 1;
            }
            KvWorker::Compat(w) => {
                w.unit(out).await;
                w.seq += 1;
            }
        }
    }
}
