//! The data plane's Read and Write: decoded requests served on the engine,
//! through the same request layer as every front (docs/wire.md).
use super::{API, Reply, status_reply};
use crate::auth::Principal;
use crate::messages::block_from_pb_checked;
use crate::refusal::{self, Refusal};
use crate::state::{self, Shared};
use crate::timing::Clock;
use bytes::Bytes;
use kvtier_core::WriteOutcome;
use kvtier_proto::bounded;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use prost::Message;
use std::time::{Duration, Instant};

pub(super) async fn read(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    max_frame: u64,
) -> Reply {
    let state::Admitted { mut outcome, hold } =
        match shared.admit((API, "read"), Some(arrived)).await {
            Ok(a) => a,
            Err(shed) => return status_reply(shed),
        };
    let r = read_inner(shared, who, meta, arrived, max_frame, &mut outcome.clock).await;
    outcome.set(refusal::outcome(&r));
    let mut reply = r.unwrap_or_else(status_reply);
    reply.hold = Some(hold);
    reply
}

/// Room a block takes in a `WireReadReply` besides its payload: its
/// `ReadBlock` plus field tags, length prefixes and its `payload_lengths`
/// entry (generous, so the encoded reply never exceeds the budget).
fn reply_overhead(rb: &pb::ReadBlock) -> u64 {
    rb.encoded_len() as u64 + 32
}

async fn read_inner(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    max_frame: u64,
    clock: &mut Clock,
) -> Result<Reply, Refusal> {
    bounded::check::<pb::WireReadRequest>(&meta).map_err(|s| crate::status::from_status(&s))?;
    let req = pb::WireReadRequest::decode(meta)
        .map_err(|e| Refusal::invalid(format!("bad read request: {e}")))?;
    let timeout = req.timeout_ms;
    // The reply must fit the frame format (u32 data length), this server's
    // frame limit and what the client said it accepts; it always carries at
    // least one block, so a client that continues from `returned` progresses.
    let mut budget = max_frame.min(u64::from(u32::MAX));
    if req.max_reply_bytes > 0 {
        budget = budget.min(req.max_reply_bytes);
    }
    let budget = budget.saturating_sub(1024); // room for ReadDone and the reply's own framing
    let req = req.request.unwrap_or_default();
    let (ns, keys) = crate::read::prepare(shared, who, &req)?;
    let deadline = (timeout > 0).then(|| arrived + Duration::from_millis(timeout as u64));
    let mut reply = pb::WireReadReply::default();
    let mut data = Vec::with_capacity(keys.len());
    let mut used = 0u64;
    // The first block's id, to fetch it again after waiting for room.
    let first = keys
        .first()
        .map(|k| kvtier_core::BlockId::new(ns.clone(), k.clone()));
    let mut reader = crate::read::PrefixReader::new(ns, keys, deadline);
    // Payloads held until the client takes them are charged to the reply
    // budget: past it the reply ends early like a full one ("size", the
    // client continues). A first block with no room waits for it in arrival
    // order (bounded by the deadline and `server.write_timeout`, then shed
    // as busy) *without holding the block*, so waiting Reads pin nothing,
    // and is then fetched again: replies give their bytes back as their
    // clients take them, so a striped load bigger than the budget is served
    // in turn instead of refused (docs/security.md, "Threats and their
    // guards").
    let mut charge: Option<crate::limits::Reservation> = None;
    while let Some((i, mut b, t)) = reader.next(shared, clock).await? {
        let rb = crate::read::read_block(i, &b, t, Bytes::new());
        let size = b.payload.len() as u64 + reply_overhead(&rb);
        if !data.is_empty() && used + size > budget {
            reader.put_back(shared, "size");
            break;
        }
        let len = b.payload.len() as u64;
        let reserved = match shared.limits.reserve_reply(len) {
            Ok(r) => r,
            Err(_) if !data.is_empty() => {
                reader.put_back(shared, "size");
                break;
            }
            Err(_) => {
                drop(b);
                let until = deadline.map(tokio::time::Instant::from_std);
                let r = match shared.limits.reserve_reply_wait(len, until).await {
                    Ok(r) => r,
                    Err(busy) => {
                        crate::limits::refused::log("wire_reply_memory", &busy.message);
                        return Err(busy);
                    }
                };
                let id = first
                    .as_ref()
                    .expect("a block was read, so there was a key");
                let mut timing = kvtier_core::StorageTiming::default();
                match shared.engine.read(id, &mut timing).await {
                    // Blocks are immutable: the same key has the same
                    // length, unless it was deleted and written anew.
                    Ok(Some((again, _))) if again.payload.len() as u64 <= len => b = again,
                    Ok(Some(_)) | Ok(None) => {
                        reader.put_back(shared, "missing");
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
                r
            }
        };
        match charge.as_mut() {
            Some(c) => c.merge(reserved),
            None => charge = Some(reserved),
        }
        // What is sent describes the block sent (it may have been fetched again).
        let rb = crate::read::read_block(i, &b, t, Bytes::new());
        let size = b.payload.len() as u64 + reply_overhead(&rb);
        used += size;
        shared.metrics.bytes_out.inc_by(b.payload.len() as u64);
        reply.payload_lengths.push(b.payload.len() as u64);
        reply.blocks.push(rb);
        data.push(b.payload);
    }
    let out = reader.outcome();
    reply.done = Some(out.done(clock));
    Ok(Reply {
        kind: Kind::ReadReply,
        meta: reply.encode_to_vec(),
        data,
        hold: None,
        charge,
        fds: Vec::new(),
    })
}

/// A Write refused before its payloads were read (bad metadata, no access):
/// counted in the metrics like any other failed write.
pub(super) fn write_rejected(shared: &Shared, arrived: Instant, status: Refusal) -> Reply {
    let clock = Clock::start(Some(arrived));
    shared.observe(API, "write", status.label(), &clock);
    status_reply(status)
}

pub(super) async fn write(
    shared: &Shared,
    req: pb::WireWriteRequest,
    payloads: Vec<(Bytes, u32)>,
    arrived: Instant,
) -> Reply {
    shared
        .serve(
            (API, "write"),
            Some(arrived),
            Err,
            refusal::outcome,
            async |clock| write_inner(shared, req, payloads, arrived, clock).await,
        )
        .await
        .unwrap_or_else(status_reply)
}

async fn write_inner(
    shared: &Shared,
    req: pb::WireWriteRequest,
    payloads: Vec<(Bytes, u32)>,
    arrived: Instant,
    clock: &mut Clock,
) -> Result<Reply, Refusal> {
    let deadline =
        (req.timeout_ms > 0).then(|| arrived + Duration::from_millis(req.timeout_ms as u64));
    let w = req.request.unwrap_or_default();
    if w.blocks.len() != payloads.len() {
        return Err(Refusal::invalid(format!(
            "{} blocks but {} payload lengths",
            w.blocks.len(),
            payloads.len()
        )));
    }
    let ns = state::namespace(&w.namespace)?;
    let max = shared.engine.config().max_block_size.bytes();
    // Verify every block before storing any of them (the payload CRCs were
    // computed while the bytes arrived).
    let blocks = w
        .blocks
        .into_iter()
        .zip(payloads)
        .enumerate()
        .map(|(i, (mut b, (payload, crc)))| {
            b.payload = payload;
            block_from_pb_checked(&ns, i, b, max, crc)
        })
        .collect::<Result<Vec<_>, _>>()?;
    shared.note_tokens(&blocks);
    let mut resp = pb::WriteResponse::default();
    for b in blocks {
        let len = b.payload.len() as u64;
        let before = clock.storage.deferred;
        let stored =
            kvtier_core::deadline::scope(deadline, shared.engine.write(b, &mut clock.storage))
                .await;
        resp.deferred += clock.storage.deferred - before;
        match stored? {
            WriteOutcome::Stored => resp.stored += 1,
            WriteOutcome::Existing => resp.existing += 1,
        }
        shared.metrics.bytes_in.inc_by(len);
    }
    resp.timing = Some(clock.finish());
    Ok(Reply {
        kind: Kind::WriteReply,
        meta: resp.encode_to_vec(),
        data: Vec::new(),
        hold: None,
        charge: None,
        fds: Vec::new(),
    })
}
