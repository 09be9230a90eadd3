//! The prefix read that both transports of `Read` share (gRPC stream in
//! `grpc::v1`, data plane in `wire`): validate the request, then read the keys
//! in order, stopping at the first missing block or at the deadline, handing
//! each block to a transport-specific sink (which counts the bytes it sends).
use crate::messages::check_count;
use crate::refusal::{Kind, Refusal};
use crate::state::{self, Shared};
use crate::timing::Clock;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use kvtier_core::{Block, BlockId, Engine, Key, Namespace, StorageTiming, TierKind};
use kvtier_proto::v1 as pb;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

/// Validates a read request: namespace, key count and keys, and the lease if one is named.
pub fn prepare(
    shared: &Shared,
    who: &crate::auth::Principal,
    req: &pb::ReadRequest,
) -> Result<(Namespace, Vec<Key>), Refusal> {
    let ns = state::namespace(&req.namespace)?;
    shared.allow(who, ns.as_str(), false)?;
    check_count(req.keys.len())?;
    let keys = state::keys(&req.keys)?;
    if req.lease_id != 0 {
        // Another namespace's lease is unknown here, in the same words as
        // one never granted: naming it must not tell whether it is active.
        if shared
            .engine
            .lease_namespace(req.lease_id)
            .is_some_and(|l| l != ns)
        {
            return Err(Refusal::new(
                Kind::FailedPrecondition,
                format!(
                    "lease {} is unknown (expired, released or never granted)",
                    req.lease_id
                ),
            ));
        }
        shared.engine.check_lease(req.lease_id)?;
    }
    Ok((ns, keys))
}

/// How a prefix read ended.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Blocks handed to the sink.
    pub returned: u32,
    /// Keys asked for.
    pub requested: u32,
    /// `missing`, `deadline`, `size` (data plane: the reply is full) or empty.
    pub reason: &'static str,
}

impl Outcome {
    /// The wire summary, with the server timing measured now.
    pub fn done(&self, clock: &Clock) -> pb::ReadDone {
        pb::ReadDone {
            returned: self.returned,
            requested: self.requested,
            partial: self.returned < self.requested,
            reason: self.reason.to_string(),
            timing: Some(clock.finish()),
        }
    }
}

/// The wire form of a block read from `tier`, carrying `payload` (the data
/// plane sends payloads outside the message and passes an empty one).
pub fn read_block(index: u32, b: &Block, tier: TierKind, payload: Bytes) -> pb::ReadBlock {
    pb::ReadBlock {
        index,
        block: Some(pb::Block {
            key: b.meta.id.key.bytes(),
            parent_key: b.meta.parent.as_ref().map_or_else(Bytes::new, Key::bytes),
            token_count: b.meta.token_count,
            crc32c: b.meta.crc32c,
            payload,
            // What is left of its TTL (0: none), so a node of a cluster that
            // keeps a block it read from a peer keeps its expiry too.
            ttl_ms: crate::messages::ttl_left(b),
            token_ids: Vec::new(),
        }),
        tier: crate::messages::tier(tier),
    }
}

/// Reads keys in order, one block per [`PrefixReader::next`], until the first
/// missing block or the deadline; [`PrefixReader::outcome`] then says why it
/// stopped. (A cursor rather than a callback keeps the callers' futures `Send`.)
///
/// When blocks may come from other nodes or the object store (a cluster, an
/// object tier), the reader keeps up to [`Engine::read_ahead`] engine reads
/// in flight, so a read of N such blocks waits about N / depth round trips
/// instead of N. Blocks are still handed out in key order and the read still
/// ends at the first missing one (reads already started past it are
/// dropped). Each block's tier times are scaled down to the time the request
/// actually waited for it, so they stay part of the service time. An
/// engine with local tiers only reads one block at a time, in place (no
/// boxed future per block): its reads do not wait.
pub struct PrefixReader {
    ns: Namespace,
    keys: std::vec::IntoIter<Key>,
    deadline: Option<Instant>,
    next_index: u32,
    out: Outcome,
    ahead: FuturesOrdered<Pending>,
}

/// One engine read of a prefix read, with the tier time it took.
type Pending = Pin<Box<dyn Future<Output = (Got, StorageTiming)> + Send>>;

enum Got {
    Block(Block, TierKind),
    Missing,
    Deadline,
    Failed(Refusal),
}

async fn read_one(
    engine: Arc<Engine>,
    id: BlockId,
    deadline: Option<Instant>,
) -> (Got, StorageTiming) {
    let mut t = StorageTiming::default();
    let fut = kvtier_core::deadline::scope(deadline, engine.read(&id, &mut t));
    let r = match deadline {
        Some(d) => match tokio::time::timeout_at(d.into(), fut).await {
            Ok(r) => r,
            Err(_) => return (Got::Deadline, t),
        },
        None => fut.await,
    };
    let got = match r {
        Ok(Some((b, tier))) => Got::Block(b, tier),
        Ok(None) => Got::Missing,
        Err(e) => Got::Failed(e.into()),
    };
    (got, t)
}

impl PrefixReader {
    /// A reader over `keys` in namespace `ns`.
    pub fn new(ns: Namespace, keys: Vec<Key>, deadline: Option<Instant>) -> Self {
        let out = Outcome {
            returned: 0,
            requested: keys.len() as u32,
            reason: "",
        };
        Self {
            ns,
            keys: keys.into_iter(),
            deadline,
            next_index: 0,
            out,
            ahead: FuturesOrdered::new(),
        }
    }

    /// The next block with its index and tier, or `None` when the read is over.
    pub async fn next(
        &mut self,
        shared: &Shared,
        clock: &mut Clock,
    ) -> Result<Option<(u32, Block, TierKind)>, Refusal> {
        if !self.out.reason.is_empty() {
            return Ok(None);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.out.reason = "deadline";
            self.ahead.clear();
            return Ok(None);
        }
        let engine = &shared.engine;
        let depth = engine.read_ahead();
        let waited = Instant::now();
        let (got, mut t) = if depth == 1 {
            // Local tiers only: read in place, nothing ahead to keep.
            let Some(key) = self.keys.next() else {
                return Ok(None);
            };
            let id = BlockId::new(self.ns.clone(), key);
            read_one(engine.clone(), id, self.deadline).await
        } else {
            while self.ahead.len() < depth {
                let Some(key) = self.keys.next() else { break };
                let id = BlockId::new(self.ns.clone(), key);
                self.ahead
                    .push_back(Box::pin(read_one(engine.clone(), id, self.deadline)));
            }
            let Some(r) = self.ahead.next().await else {
                return Ok(None);
            };
            r
        };
        // Reads that overlapped must not add up to more than the time this
        // request spent waiting for them: tier times stay part of service_us.
        let waited = waited.elapsed();
        let total = t.total();
        if total > waited {
            let f = waited.as_secs_f64() / total.as_secs_f64();
            t = StorageTiming {
                memory: t.memory.mul_f64(f),
                disk: t.disk.mul_f64(f),
                object: t.object.mul_f64(f),
                peer: t.peer.mul_f64(f),
                deferred: t.deferred,
            };
        }
        clock.storage.merge(&t);
        match got {
            Got::Block(b, t) => {
                let i = self.next_index;
                self.next_index += 1;
                self.out.returned += 1;
                Ok(Some((i, b, t)))
            }
            Got::Missing => {
                self.out.reason = "missing";
                self.ahead.clear();
                Ok(None)
            }
            Got::Deadline => {
                self.out.reason = "deadline";
                self.ahead.clear();
                Ok(None)
            }
            Got::Failed(st) => {
                self.ahead.clear();
                Err(st)
            }
        }
    }

    /// Takes back the block `next` just returned and ends the read with
    /// `reason` (the data plane's reply had no room left for it).
    ///
    /// The reads already under way are for blocks the client asks for next
    /// (it continues from `returned`), so they are not simply dropped: a
    /// task finishes them and what they fetch is promoted to memory instead
    /// of fetched again (notes/023 counted up to 3 % more GETs than blocks
    /// without this). The task is bounded: it stops at the first read that
    /// finds no block, by the request's deadline (or `server.read_timeout`
    /// when it has none), and only while fewer than
    /// [`crate::limits::HANDOFF_READS`] such reads run server-wide;
    /// otherwise the reads are dropped as before.
    pub fn put_back(&mut self, shared: &Shared, reason: &'static str) {
        self.out.returned -= 1;
        self.next_index -= 1;
        self.out.reason = reason;
        let ahead = std::mem::take(&mut self.ahead);
        if ahead.is_empty() {
            return;
        }
        let Some(slots) = shared.limits.try_handoff(ahead.len()) else {
            return;
        };
        let by = self
            .deadline
            .unwrap_or_else(|| Instant::now() + shared.limits.read_timeout);
        tokio::spawn(async move {
            let _slots = slots;
            let finish = ahead
                .take_while(|(got, _)| std::future::ready(matches!(got, Got::Block(..))))
                .for_each(|_| async {});
            let _ = tokio::time::timeout_at(by.into(), finish).await;
        });
    }

    /// How the read ended (meaningful once `next` returned `None`).
    pub fn outcome(&self) -> Outcome {
        self.out
    }
}
