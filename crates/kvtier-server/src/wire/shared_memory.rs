//! MapRead, Release, Lend and WriteLent: Read and Write whose payloads move
//! through shared memory, for a client on this host (the same-host front,
//! docs/local.md).
//!
//! Loads: the blocks a MapRead finds are placed in their namespace's arena
//! (`crate::shm`; a block already there is not copied) and the reply says
//! where; the segments' descriptors ride with the reply the first time a
//! connection needs them, and the client maps them read-only and copies, or
//! lets its GPU DMA, straight out of them. Each reply holds its slots under
//! a lease until the client releases it or its connection closes, so no
//! slot a client may be reading is ever reused.
//!
//! Saves: a connection is lent a segment of its own (Lend); it fills it and
//! sends WriteLent; the server copies each payload into the namespace's
//! arena, checksumming the copy, and verifies it before storing, so what
//! the client writes into its segment afterwards changes nothing stored.
//!
//! No process's memory is touched by another process's system calls, and
//! nothing here depends on who the peer process is (docs/security.md,
//! "Shared memory").
use super::{Reply, status_reply, write, write_rejected};
use crate::auth::Principal;
use crate::refusal::{self, Refusal};
use crate::shm::Shm;
use crate::state::{self, Shared};
use crate::timing::Clock;
use bytes::{Bytes, BytesMut};
use kvtier_proto::bounded;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{Kind, check_lengths};
use kvtier_shm::{Arena, Segment, Sharing, arena::Charge};
use prost::Message;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

const API: &str = "local";

/// The `WireError.reason` of "this front cannot share memory with you":
/// clients then send Read/Write with bytes instead (docs/wire.md).
pub(super) const NO_MEMORY_COPY: &str = "no_memory_copy";

/// Leases one connection may hold at once: a client releases each before
/// its next read, so more means one that never does.
const MAX_LEASES: usize = 16;

/// Bytes copied and checksummed at a time (the CRC pass reads from cache).
const CHUNK: usize = 1 << 20;

/// What a connection holds of the front's shared memory.
pub(super) struct ShmConn {
    shm: Arc<Shm>,
    /// Segments whose descriptors this connection was sent (a dead one has
    /// been retired: the client is told, and unmaps it).
    sent: HashMap<u64, Weak<Segment>>,
    /// Slots under lease, by lease id.
    leases: HashMap<u64, Vec<Bytes>>,
    next_lease: u64,
    /// The segment lent to this connection for its saves, and its charge.
    lent: Option<(Arc<Segment>, Charge)>,
}

impl ShmConn {
    pub(super) fn new(shm: Arc<Shm>) -> Self {
        Self {
            shm,
            sent: HashMap::new(),
            leases: HashMap::new(),
            next_lease: 1,
            lent: None,
        }
    }

    /// `segs` with the ones this connection has not been sent yet, whose
    /// descriptors go with the reply (`Reply::fds`).
    fn announce(&mut self, segs: impl IntoIterator<Item = Arc<Segment>>) -> Vec<Arc<Segment>> {
        let mut out = Vec::new();
        for s in segs {
            if self.sent.insert(s.id(), Arc::downgrade(&s)).is_none() {
                out.push(s);
            }
        }
        out
    }

    /// Segments this connection was sent that have been retired since.
    fn retired(&mut self) -> Vec<u64> {
        let gone: Vec<u64> = self
            .sent
            .iter()
            .filter(|(_, w)| w.strong_count() == 0)
            .map(|(&id, _)| id)
            .collect();
        for id in &gone {
            self.sent.remove(id);
        }
        gone
    }
}

/// The refusal sent off the same-host front, with its reason.
pub(super) fn no_memory_copy(why: &str) -> Reply {
    let mut r = status_reply(Refusal::new(
        refusal::Kind::FailedPrecondition,
        format!("{why} (docs/local.md); send Read/Write over the socket instead"),
    ));
    let mut e = pb::WireError::decode(&r.meta[..]).unwrap_or_default();
    e.reason = NO_MEMORY_COPY.into();
    r.meta = e.encode_to_vec();
    r
}

fn reply(kind: Kind, meta: Vec<u8>, data: Vec<Bytes>, fds: Vec<Arc<Segment>>) -> Reply {
    Reply {
        kind,
        meta,
        data,
        hold: None,
        charge: None,
        fds,
    }
}

pub(super) async fn map_read(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    max_frame: u64,
    conn: &mut ShmConn,
) -> Reply {
    let state::Admitted { mut outcome, hold } =
        match shared.admit((API, "read"), Some(arrived)).await {
            Ok(a) => a,
            Err(shed) => return status_reply(shed),
        };
    let r = map_read_inner(
        shared,
        who,
        meta,
        arrived,
        max_frame,
        conn,
        &mut outcome.clock,
    )
    .await;
    outcome.set(refusal::outcome(&r));
    let mut reply = r.unwrap_or_else(status_reply);
    reply.hold = Some(hold);
    reply
}

/// Where a found block's bytes are: a slot (kept alive by the `Bytes`), or
/// inline in the reply (no shared memory left for it).
enum Placed {
    Slot(Arc<Segment>, usize, Bytes),
    Inline(Bytes),
}

/// Each payload in `arena`: where it already is, or copied into a new slot
/// there, or inline when the arena has no room.
fn place(shm: &Shm, arena: &Arena, payloads: Vec<Bytes>) -> Vec<Placed> {
    payloads
        .into_iter()
        .map(|p| {
            if let Some((seg, off)) = arena.locate(&p) {
                return Placed::Slot(seg, off, p);
            }
            match shm.alloc(arena, p.len()) {
                Ok(Some(mut s)) => {
                    s.bytes_mut().copy_from_slice(&p);
                    let (seg, off) = (s.segment().clone(), s.offset());
                    Placed::Slot(seg, off, s.freeze())
                }
                Ok(None) => Placed::Inline(p),
                Err(e) => {
                    tracing::warn!(error = %e, "same-host socket: cannot create shared memory; block sent inline");
                    Placed::Inline(p)
                }
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn map_read_inner(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    max_frame: u64,
    conn: &mut ShmConn,
    clock: &mut Clock,
) -> Result<Reply, Refusal> {
    bounded::check::<pb::WireReadRequest>(&meta).map_err(|s| crate::status::from_status(&s))?;
    let req = pb::WireReadRequest::decode(meta)
        .map_err(|e| Refusal::invalid(format!("bad read request: {e}")))?;
    if conn.leases.len() >= MAX_LEASES {
        return Err(Refusal::new(
            refusal::Kind::ResourceExhausted,
            format!(
                "this connection holds {MAX_LEASES} leases: release them (Release) before reading more"
            ),
        ));
    }
    let timeout = req.timeout_ms;
    let rr = req.request.unwrap_or_default();
    let (ns, keys) = crate::read::prepare(shared, who, &rr)?;
    let arena = conn.shm.arena(ns.as_str());
    let deadline = (timeout > 0).then(|| arrived + Duration::from_millis(timeout as u64));
    let mut read = pb::WireReadReply::default();
    let mut payloads = Vec::with_capacity(keys.len());
    let mut reader = crate::read::PrefixReader::new(ns, keys, deadline);
    while let Some((i, b, t)) = reader.next(shared, clock).await? {
        read.payload_lengths.push(b.payload.len() as u64);
        read.blocks
            .push(crate::read::read_block(i, &b, t, Bytes::new()));
        payloads.push(b.payload);
    }
    let mut out = reader.outcome();
    // Copies of blocks not yet in shared memory: off the runtime's threads.
    let shm = conn.shm.clone();
    let placed = tokio::task::spawn_blocking(move || place(&shm, &arena, payloads))
        .await
        .map_err(|e| Refusal::new(refusal::Kind::Internal, format!("placing blocks: {e}")))?;
    // Inline bytes must fit one frame (and the client's limit); past that
    // the reply ends early ("size") and the client continues from there.
    let mut room = max_frame.min(u64::from(u32::MAX)).saturating_sub(1 << 16);
    if req.max_reply_bytes > 0 {
        room = room.min(req.max_reply_bytes);
    }
    let (mut slots, mut data, mut held, mut segs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut inline = 0u64;
    for (n, p) in placed.into_iter().enumerate() {
        match p {
            Placed::Slot(seg, off, bytes) => {
                slots.push(pb::WireSlot {
                    segment: seg.id(),
                    offset: off as u64,
                });
                segs.push(seg);
                held.push(bytes);
            }
            Placed::Inline(bytes) => {
                inline += bytes.len() as u64;
                if n > 0 && inline > room {
                    read.blocks.truncate(n);
                    read.payload_lengths.truncate(n);
                    out.returned = n as u32;
                    out.reason = "size";
                    break;
                }
                slots.push(pb::WireSlot::default());
                data.push(bytes);
            }
        }
    }
    let lease = if held.is_empty() {
        0
    } else {
        let id = conn.next_lease;
        conn.next_lease += 1;
        conn.leases.insert(id, held);
        id
    };
    segs.dedup_by_key(|s| s.id());
    let retired = conn.retired();
    let fds = conn.announce(segs);
    shared
        .metrics
        .bytes_out
        .inc_by(read.payload_lengths.iter().sum());
    read.done = Some(out.done(clock));
    let meta = pb::WireMapReadReply {
        read: Some(read),
        slots,
        lease,
        segments: fds
            .iter()
            .map(|s| pb::WireSegment {
                id: s.id(),
                len: s.len() as u64,
            })
            .collect(),
        retired,
    };
    Ok(reply(Kind::MapReadReply, meta.encode_to_vec(), data, fds))
}

pub(super) fn release(meta: Bytes, conn: &mut ShmConn) -> Reply {
    let req = match bounded::check::<pb::WireRelease>(&meta)
        .map_err(|s| crate::status::from_status(&s))
        .and_then(|()| {
            pb::WireRelease::decode(meta).map_err(|e| Refusal::invalid(format!("bad release: {e}")))
        }) {
        Ok(r) => r,
        Err(s) => return status_reply(s),
    };
    for id in req.leases {
        conn.leases.remove(&id);
    }
    reply(Kind::ReleaseReply, Vec::new(), Vec::new(), Vec::new())
}

pub(super) fn lend(meta: Bytes, max_frame: u64, conn: &mut ShmConn) -> Reply {
    let req = match pb::WireLend::decode(meta) {
        Ok(r) => r,
        Err(e) => return status_reply(Refusal::invalid(format!("bad lend request: {e}"))),
    };
    if req.len == 0 || req.len > max_frame {
        return status_reply(Refusal::invalid(format!(
            "a lent segment of {} bytes: at least 1 and at most {max_frame} (server.max_message_size)",
            req.len
        )));
    }
    let fits = conn
        .lent
        .as_ref()
        .is_some_and(|(s, _)| s.len() as u64 >= req.len);
    if !fits {
        // The old one goes first: its bytes count until it is dropped.
        conn.lent = None;
        let Some(charge) = conn.shm.budget().charge(req.len) else {
            return status_reply(Refusal::new(
                refusal::Kind::ResourceExhausted,
                "no shared memory left to lend (server.local_shared_memory); send Write",
            ));
        };
        match Segment::create("lent", req.len as usize, Sharing::Lent) {
            Ok(s) => conn.lent = Some((Arc::new(s), charge)),
            Err(e) => return no_memory_copy(&format!("cannot create shared memory: {e}")),
        }
    }
    let seg = conn
        .lent
        .as_ref()
        .map(|(s, _)| s.clone())
        .expect("set above");
    let info = pb::WireSegment {
        id: seg.id(),
        len: seg.len() as u64,
    };
    let fds = conn.announce([seg]);
    let meta = pb::WireLent {
        segment: Some(info),
    };
    reply(Kind::LendReply, meta.encode_to_vec(), Vec::new(), fds)
}

pub(super) async fn write_lent(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    conn: &mut ShmConn,
) -> Reply {
    let mut w = match bounded::check::<pb::WireWriteRequest>(&meta)
        .map_err(|s| crate::status::from_status(&s))
        .and_then(|()| {
            pb::WireWriteRequest::decode(meta)
                .map_err(|e| Refusal::invalid(format!("bad write request: {e}")))
        }) {
        Ok(r) => r,
        Err(s) => return write_rejected(shared, arrived, s),
    };
    let Some(seg) = conn.lent.as_ref().map(|(s, _)| s.clone()) else {
        let s = Refusal::new(
            refusal::Kind::FailedPrecondition,
            "WriteLent before Lend: this connection has no lent segment",
        );
        return write_rejected(shared, arrived, s);
    };
    let lengths = w.payload_lengths.clone();
    let total = match check_lent(shared, who, &w, &lengths, seg.len() as u64) {
        Ok(t) => t,
        Err(s) => return write_rejected(shared, arrived, s),
    };
    let _held = match shared.limits.reserve(total) {
        Ok(r) => r,
        Err(s) => return write_rejected(shared, arrived, s),
    };
    let ns = w.request.as_ref().map_or("", |r| r.namespace.as_str());
    let arena = conn.shm.arena(ns);
    let shm = conn.shm.clone();
    let copied = tokio::task::spawn_blocking(move || copy_lent(&shm, &seg, &arena, &lengths)).await;
    let payloads = match copied {
        Ok(p) => p,
        Err(e) => {
            let s = Refusal::new(refusal::Kind::Internal, format!("copy task: {e}"));
            return write_rejected(shared, arrived, s);
        }
    };
    let blocks = w.request.as_ref().map_or(&[][..], |r| &r.blocks[..]);
    if let Some(i) = blocks
        .iter()
        .zip(&payloads)
        .position(|(b, (_, crc))| b.crc32c != *crc)
    {
        let r = Refusal::new(
            refusal::Kind::DataLoss,
            format!(
                "blocks[{i}]: the bytes in the lent segment do not match the crc32c sent \
                 (did they change before the reply?); nothing stored"
            ),
        );
        return write_rejected(shared, arrived, r);
    }
    w.payload_lengths = payloads.iter().map(|(p, _)| p.len() as u64).collect();
    write(shared, w, payloads, arrived).await
}

/// Where a saved payload is copied to: a slot of its namespace's arena,
/// or ordinary memory when the arena has no room.
enum Dest {
    Slot(kvtier_shm::SlotMut),
    Heap(BytesMut),
}

impl Dest {
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Dest::Slot(s) => s.bytes_mut(),
            Dest::Heap(b) => b,
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Dest::Slot(s) => s.freeze(),
            Dest::Heap(b) => b.freeze(),
        }
    }
}

/// Copies each payload out of the lent segment into a slot of `arena` (or
/// fresh memory when it has no room), with the CRC32C of the copy; on as
/// many threads as there are cores, up to 8, for large saves.
fn copy_lent(shm: &Shm, seg: &Segment, arena: &Arena, lengths: &[u64]) -> Vec<(Bytes, u32)> {
    let mut at = 0usize;
    let mut jobs: Vec<(usize, Dest)> = lengths
        .iter()
        .map(|&l| {
            let l = l as usize;
            let off = at;
            at += l;
            let d = match shm.alloc(arena, l).ok().flatten() {
                Some(s) => Dest::Slot(s),
                None => Dest::Heap(BytesMut::zeroed(l)),
            };
            (off, d)
        })
        .collect();
    let copy = |(off, d): &mut (usize, Dest)| {
        let mut crc = 0u32;
        for (k, chunk) in d.bytes_mut().chunks_mut(CHUNK).enumerate() {
            seg.copy_out(*off + k * CHUNK, chunk);
            crc = crc32c::crc32c_append(crc, chunk);
        }
        crc
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (at >> 23).clamp(1, 8).min(cores).min(jobs.len().max(1));
    let crcs: Vec<u32> = if threads <= 1 {
        jobs.iter_mut().map(copy).collect()
    } else {
        let per = jobs.len().div_ceil(threads);
        std::thread::scope(|sc| {
            let hs: Vec<_> = jobs
                .chunks_mut(per)
                .map(|run| sc.spawn(move || run.iter_mut().map(copy).collect::<Vec<u32>>()))
                .collect();
            hs.into_iter()
                .flat_map(|h| h.join().expect("a copy thread panicked"))
                .collect()
        })
    };
    jobs.into_iter()
        .zip(crcs)
        .map(|((_, d), c)| (d.freeze(), c))
        .collect()
}

fn check_lent(
    shared: &Shared,
    who: &Principal,
    w: &pb::WireWriteRequest,
    lengths: &[u64],
    room: u64,
) -> Result<u64, Refusal> {
    let total = lengths
        .iter()
        .try_fold(0u64, |a, &l| a.checked_add(l))
        .ok_or_else(|| Refusal::invalid("payload lengths overflow"))?;
    check_lengths(lengths, total).map_err(Refusal::invalid)?;
    if total > room {
        return Err(Refusal::invalid(format!(
            "payloads of {total} bytes but the lent segment holds {room}: ask for a larger one (Lend)"
        )));
    }
    let ns = w.request.as_ref().map_or("", |r| r.namespace.as_str());
    shared.allow(who, ns, true)?;
    Ok(total)
}
