//! ReadInto and WriteFrom: Read and Write whose payloads move by memory, not
//! through the socket, for a client on this host (the same-host front,
//! docs/local.md).
//!
//! The client names regions of its own address space; the server copies each
//! block from the store's buffer straight into the client's region
//! (`process_vm_writev`), or each payload out of the client's memory into one
//! fresh buffer (`process_vm_readv`), checksumming it while it is still in
//! cache. One CPU copy either way, into or out of memory the caller
//! allocated itself (a torch tensor, a pinned staging buffer). The server
//! never maps or exposes its own memory, so a client only ever receives the
//! blocks its token may read, exactly as over the socket.
//!
//! Whose memory: only the process that connected, while it still is what it
//! was at connect (`crate::peer`, checked before each block and after the
//! copies); anything else is refused with the reason
//! `no_memory_copy` (`super::no_copy`), the only refusal after which clients stop asking
//! for copies. No message names a pid, nor the checksum of bytes copied out
//! of a process (docs/security.md, "Threats and their guards").
//!
//! Safety of the client's memory: a copy into it starts only while the
//! request's deadline has not passed and the client is still connected
//! (both checked before each block), and the client waits for the reply, or
//! for this server to close the connection, before it reuses its buffers.
//! The connection stays open until the copies have ended (the copy threads
//! hold it), so its close means no copy is still landing (docs/local.md,
//! "Cancelled reads").
use super::no_copy::{CopyError, Failed, classify, no_copy, panicked, with_reason};
use super::{Reply, status_reply, write, write_rejected};
use crate::auth::Principal;
use crate::peer::Peer;
use crate::refusal::{self, Refusal};
use crate::rx_stamp::FrameStream;
use crate::state::{self, Shared};
use crate::timing::Clock;
use bytes::{Bytes, BytesMut};
use kvtier_proto::bounded;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{Kind, check_lengths};
use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
use prost::Message;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

const API: &str = "local";

/// Bytes copied per system call on writes: small enough that the CRC32C
/// pass right after it reads from cache, large enough that the calls cost
/// nothing next to the copy.
const CHUNK: usize = 1 << 20;

/// Most remote ranges one `process_vm_writev` takes (the kernel's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

/// Copies `src` into the client's memory: the regions `to`, filled in
/// order (all of `src`, or an error; the regions were checked to hold it).
fn copy_out(peer: &Peer, src: &[u8], to: &[pb::Region], i: usize) -> Result<(), CopyError> {
    peer.check_quick()?;
    let pid = peer.pid();
    // The ranges `src` covers, each cut to what is left of it.
    let mut ranges = Vec::with_capacity(to.len());
    let mut left = src.len();
    for r in to {
        if left == 0 {
            break;
        }
        let n = usize::try_from(r.len).unwrap_or(usize::MAX).min(left);
        // Empty regions are skipped: a run of them would fill a whole call
        // and copy nothing, which reads as a fault.
        if n > 0 {
            ranges.push((r.addr as usize, n));
            left -= n;
        }
    }
    let (mut done, mut at, mut off) = (0usize, 0usize, 0usize);
    while done < src.len() {
        let remote: Vec<RemoteIoVec> = ranges[at..]
            .iter()
            .take(MAX_IOV)
            .enumerate()
            .map(|(j, &(base, len))| {
                let skip = if j == 0 { off } else { 0 };
                RemoteIoVec {
                    base: base.wrapping_add(skip),
                    len: len - skip,
                }
            })
            .collect();
        let mut n = match process_vm_writev(pid, &[IoSlice::new(&src[done..])], &remote) {
            Ok(0) => return Err(CopyError::Fault(i)),
            Ok(n) => n,
            Err(e) => return Err(classify(e, i)),
        };
        done += n;
        // Past the ranges (and the part of one) that this call filled.
        while n > 0 {
            let room = ranges[at].1 - off;
            if n >= room {
                n -= room;
                at += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// Each block's destination regions: `dest[i]` alone, or its share of
/// `parts` (`part_counts`), taken out of the request (the copies run on
/// other threads).
struct Destinations {
    regions: Vec<pb::Region>,
    spans: Vec<std::ops::Range<usize>>,
}

impl Destinations {
    /// Checked against the key count before any block is read.
    fn take(req: &mut pb::WireReadIntoRequest, keys: usize) -> Result<Self, Refusal> {
        if req.parts.is_empty() && req.part_counts.is_empty() {
            if req.dest.len() != keys {
                return Err(Refusal::invalid(format!(
                    "{keys} keys but {} destination regions",
                    req.dest.len()
                )));
            }
            return Ok(Self {
                regions: std::mem::take(&mut req.dest),
                spans: (0..keys).map(|i| i..i + 1).collect(),
            });
        }
        if !req.dest.is_empty() || req.part_counts.len() != keys {
            return Err(Refusal::invalid(format!(
                "{keys} keys but {} destinations ({} part counts): give dest or parts, one per key",
                req.dest.len(),
                req.part_counts.len()
            )));
        }
        let total: u64 = req.part_counts.iter().map(|&c| u64::from(c)).sum();
        if total != req.parts.len() as u64 {
            return Err(Refusal::invalid(format!(
                "part counts add up to {total} but {} regions were given",
                req.parts.len()
            )));
        }
        let mut spans = Vec::with_capacity(keys);
        let mut at = 0usize;
        for &c in &req.part_counts {
            spans.push(at..at + c as usize);
            at += c as usize;
        }
        Ok(Self {
            regions: std::mem::take(&mut req.parts),
            spans,
        })
    }

    fn of(&self, i: usize) -> &[pb::Region] {
        &self.regions[self.spans[i].clone()]
    }
}

/// What `to` holds together (saturating: a sum past u64 holds anything).
fn capacity(to: &[pb::Region]) -> u64 {
    to.iter().fold(0u64, |a, r| a.saturating_add(r.len))
}

/// Threads for copying `blocks` blocks of `bytes` in all: one per 8 MiB, at
/// most one per block and per core, at most 8.
fn copy_threads(blocks: usize, bytes: u64) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    ((bytes >> 23) as usize)
        .clamp(1, 8)
        .min(cores)
        .min(blocks.max(1))
}

/// Copies `dst.len()` bytes of the client's memory at `addr` into `dst`, a
/// chunk at a time; returns their CRC32C, computed while each chunk is in
/// cache.
fn copy_in(peer: &Peer, dst: &mut [u8], addr: u64, i: usize) -> Result<u32, CopyError> {
    peer.check_quick()?;
    let pid = peer.pid();
    let mut crc = 0u32;
    let mut done = 0usize;
    while done < dst.len() {
        let want = (dst.len() - done).min(CHUNK);
        let chunk = &mut dst[done..done + want];
        let remote = RemoteIoVec {
            base: addr as usize + done,
            len: want,
        };
        let n = match process_vm_readv(pid, &mut [IoSliceMut::new(chunk)], &[remote]) {
            Ok(0) => return Err(CopyError::Fault(i)),
            Ok(n) => n,
            Err(e) => return Err(classify(e, i)),
        };
        crc = crc32c::crc32c_append(crc, &dst[done..done + n]);
        done += n;
    }
    Ok(crc)
}

/// ReadInto: the blocks of a Read, copied into the client's regions, while
/// watching the connection. A client whose read is cancelled closes its
/// end (docs/local.md, "Cancelled reads"): no further block is then copied
/// into its memory, and it gets no answer (`None`: close the connection).
/// The copy threads hold the connection open until they end, so the close
/// the client waits for comes only once nothing more can land.
pub(super) async fn read_into<S: FrameStream>(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    peer: &Arc<Peer>,
    sock: &mut S,
) -> Option<Reply> {
    // Without a second descriptor the connection could close while a copy
    // still lands (the client then reuses its buffers): refuse instead.
    let Some(held) = sock.held_open() else {
        let busy = Refusal::new(
            refusal::Kind::Unavailable,
            "the server is out of file descriptors for this read; retry",
        );
        return Some(status_reply(busy));
    };
    let stop = Arc::new(AtomicBool::new(false));
    let copy = read_into_admitted(shared, who, meta, arrived, peer, (stop.clone(), Some(held)));
    tokio::pin!(copy);
    let mut byte = [0u8; 1];
    tokio::select! {
        r = &mut copy => Some(r),
        // The client sends nothing while it waits for this answer (one
        // request in flight per connection): its end closed, an error or a
        // stray byte all mean it is no longer waiting.
        _ = sock.read(&mut byte) => {
            stop.store(true, Ordering::Release);
            copy.await;
            None
        }
    }
}

/// Set when the client is gone (no further block is copied), and the
/// connection, held open by the copies.
type Watch = (Arc<AtomicBool>, Option<OwnedFd>);

async fn read_into_admitted(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    peer: &Arc<Peer>,
    watch: Watch,
) -> Reply {
    let state::Admitted { mut outcome, hold } =
        match shared.admit((API, "read"), Some(arrived)).await {
            Ok(a) => a,
            Err(shed) => return status_reply(shed),
        };
    let r = read_into_inner(shared, who, meta, arrived, peer, watch, &mut outcome.clock).await;
    outcome.set(r.as_ref().map_or_else(Failed::label, |_| "ok".into()));
    drop(hold);
    r.unwrap_or_else(Failed::reply)
}

async fn read_into_inner(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    peer: &Arc<Peer>,
    (stop, held): Watch,
    clock: &mut Clock,
) -> Result<Reply, Failed> {
    let gone = || Refusal::new(refusal::Kind::Cancelled, "the client closed the connection");
    let target = peer.clone();
    bounded::check::<pb::WireReadIntoRequest>(&meta).map_err(|s| crate::status::from_status(&s))?;
    let mut req = pb::WireReadIntoRequest::decode(meta)
        .map_err(|e| Refusal::invalid(format!("bad read-into request: {e}")))?;
    let read = req.read.take().unwrap_or_default();
    let timeout = read.timeout_ms;
    let rr = read.request.unwrap_or_default();
    let dests = Destinations::take(&mut req, rr.keys.len())?;
    let (ns, keys) = crate::read::prepare(shared, who, &rr)?;
    let deadline = (timeout > 0).then(|| arrived + Duration::from_millis(timeout as u64));
    let mut reply = pb::WireReadReply::default();
    let mut found: Vec<(Bytes, usize)> = Vec::with_capacity(keys.len());
    let mut reader = crate::read::PrefixReader::new(ns, keys, deadline);
    while let Some((i, b, t)) = reader.next(shared, clock).await? {
        if stop.load(Ordering::Acquire) {
            return Err(gone().into());
        }
        let room = capacity(dests.of(i as usize));
        if b.payload.len() as u64 > room {
            return Err(Refusal::invalid(format!(
                "block {i} is {} bytes but its destination holds {room}",
                b.payload.len(),
            ))
            .into());
        }
        reply.payload_lengths.push(b.payload.len() as u64);
        reply
            .blocks
            .push(crate::read::read_block(i, &b, t, Bytes::new()));
        found.push((b.payload, i as usize));
    }
    let mut out = reader.outcome();
    // The copies, off the async workers (a 16 MiB block takes milliseconds).
    // None starts after the deadline: the client may have stopped waiting.
    // Several threads, each a contiguous run of blocks; the reply covers the
    // prefix copied whole (a run cut by the deadline ends it).
    // The full check once before the copies (each block's is one stat).
    target.check().map_err(Failed::NoCopy)?;
    let bytes: u64 = found.iter().map(|(p, _)| p.len() as u64).sum();
    let threads = copy_threads(found.len(), bytes);
    let stopped = stop.clone();
    let copied = tokio::task::spawn_blocking(move || {
        // Closed when the copies end, not before (see `read_into`).
        let _held = held;
        let stop = &stop;
        let per = found.len().div_ceil(threads).max(1);
        let dests = &dests;
        let target = &*target;
        let done = std::thread::scope(|s| {
            let handles: Vec<_> = found
                .chunks(per)
                .enumerate()
                .map(|(c, run)| {
                    s.spawn(move || {
                        for (j, (payload, i)) in run.iter().enumerate() {
                            if deadline.is_some_and(|d| Instant::now() >= d)
                                || stop.load(Ordering::Acquire)
                            {
                                return Ok(j);
                            }
                            copy_out(target, payload, dests.of(*i), c * per + j)?;
                        }
                        Ok(run.len())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(panicked())))
                .collect::<Result<Vec<usize>, CopyError>>()
        })?;
        let mut prefix = 0;
        for (c, n) in done.into_iter().enumerate() {
            prefix += n;
            if n < per.min(found.len() - c * per) {
                break;
            }
        }
        Ok(prefix)
    })
    .await
    .map_err(|e| Refusal::new(refusal::Kind::Internal, format!("copy task: {e}")))?
    .map_err(|e: CopyError| e.failed("into"))?;
    if stopped.load(Ordering::Acquire) {
        return Err(gone().into());
    }
    if copied < reply.blocks.len() {
        reply.blocks.truncate(copied);
        reply.payload_lengths.truncate(copied);
        out.returned = copied as u32;
        out.reason = "deadline";
    }
    let bytes: u64 = reply.payload_lengths.iter().sum();
    shared.metrics.bytes_out.inc_by(bytes);
    reply.done = Some(out.done(clock));
    Ok(Reply {
        kind: Kind::ReadIntoReply,
        meta: reply.encode_to_vec(),
        data: Vec::new(),
        hold: None,
        charge: None,
    })
}

/// WriteFrom: a Write whose payloads are copied out of the client's memory.
pub(super) async fn write_from(
    shared: &Shared,
    who: &Principal,
    meta: Bytes,
    arrived: Instant,
    max_frame: u64,
    peer: &std::sync::Arc<Peer>,
) -> Reply {
    let req = match bounded::check::<pb::WireWriteFromRequest>(&meta)
        .map_err(|s| crate::status::from_status(&s))
        .and_then(|()| {
            pb::WireWriteFromRequest::decode(meta)
                .map_err(|e| Refusal::invalid(format!("bad write-from request: {e}")))
        }) {
        Ok(r) => r,
        Err(s) => return write_rejected(shared, arrived, s),
    };
    let mut w = req.write.unwrap_or_default();
    let lengths = std::mem::take(&mut w.payload_lengths);
    let total = match check_from(shared, who, &w, &lengths, &req.source, max_frame) {
        Ok(t) => t,
        Err(s) => return write_rejected(shared, arrived, s),
    };
    // The payloads are held in memory from here until stored.
    let _held = match shared.limits.reserve(total) {
        Ok(r) => r,
        Err(s) => return write_rejected(shared, arrived, s),
    };
    let sources = req.source;
    if let Err(why) = peer.check() {
        return with_reason(write_rejected(shared, arrived, no_copy(&why)));
    }
    let target = peer.clone();
    let copied = tokio::task::spawn_blocking(move || {
        let target = &*target;
        // One buffer per block (each freed on its own when evicted), zeroed by
        // the allocator's fresh pages (calloc), not by a pass of ours; the
        // blocks copied by several threads at once (a write is one request:
        // nothing else spreads it over the cores).
        let mut bufs: Vec<BytesMut> = lengths
            .iter()
            .map(|&l| BytesMut::zeroed(l as usize))
            .collect();
        let threads = copy_threads(bufs.len(), total);
        let per = bufs.len().div_ceil(threads).max(1);
        let crcs = std::thread::scope(|s| {
            let handles: Vec<_> = bufs
                .chunks_mut(per)
                .zip(sources.chunks(per))
                .enumerate()
                .map(|(c, (bs, addrs))| {
                    s.spawn(move || {
                        bs.iter_mut()
                            .zip(addrs)
                            .enumerate()
                            .map(|(j, (b, &addr))| copy_in(target, b, addr, c * per + j))
                            .collect::<Result<Vec<u32>, CopyError>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(panicked())))
                .collect::<Result<Vec<Vec<u32>>, CopyError>>()
        })?;
        // The bytes are kept only if the process is still the one that
        // connected now that they are copied.
        target.check()?;
        Ok::<_, CopyError>(
            bufs.into_iter()
                .map(BytesMut::freeze)
                .zip(crcs.into_iter().flatten())
                .collect::<Vec<_>>(),
        )
    })
    .await;
    let payloads = match copied {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            return match e.failed("from") {
                Failed::Refused(r) => write_rejected(shared, arrived, r),
                Failed::NoCopy(why) => with_reason(write_rejected(shared, arrived, no_copy(&why))),
            };
        }
        Err(e) => {
            let s = Refusal::new(refusal::Kind::Internal, format!("copy task: {e}"));
            return write_rejected(shared, arrived, s);
        }
    };
    // Bytes copied out of a process are checked here, so that a mismatch
    // names no checksum of them: the caller did not send those bytes.
    if let Some(i) = mismatch(&w, &payloads) {
        let r = Refusal::new(
            refusal::Kind::DataLoss,
            format!(
                "blocks[{i}]: the bytes at its source address do not match the crc32c sent \
                 (did the buffer change before the reply?); nothing stored"
            ),
        );
        return write_rejected(shared, arrived, r);
    }
    write(shared, w, payloads, arrived).await
}

/// The first block whose copied bytes' CRC32C differs from the one sent.
fn mismatch(w: &pb::WireWriteRequest, payloads: &[(Bytes, u32)]) -> Option<usize> {
    let blocks = w.request.as_ref().map_or(&[][..], |r| &r.blocks[..]);
    blocks
        .iter()
        .zip(payloads)
        .position(|(b, (_, crc))| b.crc32c != *crc)
}

/// Checks a WriteFrom before anything is copied; returns its payload bytes.
fn check_from(
    shared: &Shared,
    who: &Principal,
    w: &pb::WireWriteRequest,
    lengths: &[u64],
    sources: &[u64],
    max_frame: u64,
) -> Result<u64, Refusal> {
    if lengths.len() != sources.len() {
        return Err(Refusal::invalid(format!(
            "{} payload lengths but {} source addresses",
            lengths.len(),
            sources.len()
        )));
    }
    let total = lengths
        .iter()
        .try_fold(0u64, |a, &l| a.checked_add(l))
        .ok_or_else(|| Refusal::invalid("payload lengths overflow"))?;
    check_lengths(lengths, total).map_err(Refusal::invalid)?;
    if total > max_frame {
        return Err(Refusal::invalid(format!(
            "a write of {total} bytes exceeds the maximum message size of {max_frame} bytes \
             (server.max_message_size): split it"
        )));
    }
    let ns = w.request.as_ref().map_or("", |r| r.namespace.as_str());
    shared.allow(who, ns, true)?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: u64, len: u64) -> pb::Region {
        pb::Region { addr, len }
    }

    #[test]
    fn destinations_are_one_region_or_a_share_of_the_parts() {
        let mut one = pb::WireReadIntoRequest {
            dest: vec![region(10, 5), region(20, 5)],
            ..Default::default()
        };
        let d = Destinations::take(&mut one, 2).unwrap();
        assert_eq!(d.of(1), &[region(20, 5)]);

        let mut parts = pb::WireReadIntoRequest {
            parts: vec![region(1, 1), region(2, 2), region(3, 3)],
            part_counts: vec![2, 0, 1],
            ..Default::default()
        };
        let d = Destinations::take(&mut parts, 3).unwrap();
        assert_eq!(d.of(0), &[region(1, 1), region(2, 2)]);
        assert!(d.of(1).is_empty());
        assert_eq!(capacity(d.of(2)), 3);
        assert_eq!(capacity(&[region(0, u64::MAX), region(0, 1)]), u64::MAX);
    }

    #[test]
    fn mismatched_destinations_are_refused_before_any_read() {
        let cases = [
            (
                vec![region(1, 1)],
                vec![],
                vec![],
                "2 keys but 1 destination regions",
            ),
            (
                vec![],
                vec![region(1, 1)],
                vec![1],
                "2 keys but 0 destinations (1 part counts)",
            ),
            (
                vec![],
                vec![region(1, 1)],
                vec![1, 1],
                "part counts add up to 2 but 1 regions",
            ),
            (
                vec![region(1, 1)],
                vec![region(1, 1)],
                vec![1, 0],
                "give dest or parts",
            ),
        ];
        for (dest, parts, part_counts, want) in cases {
            let mut r = pb::WireReadIntoRequest {
                dest,
                parts,
                part_counts,
                ..Default::default()
            };
            let err = Destinations::take(&mut r, 2).err().expect("refused");
            assert_eq!(err.kind, refusal::Kind::InvalidArgument);
            assert!(err.message.contains(want), "{} lacks {want}", err.message);
        }
    }
}
