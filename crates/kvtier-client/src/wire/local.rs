//! Loads and saves through shared memory on the same-host socket
//! (docs/local.md): the server says where each block is in segments it
//! created and sent over the socket; this process maps them read-only and
//! copies each block out into the caller's buffers itself (or, for a GPU,
//! hands the mapping to the driver). A save fills the segment the server
//! lent this connection and sends WriteLent. The server never touches this
//! process's memory, and this process copies only inside calls it is in:
//! a dropped call leaves nothing landing in the caller's buffers later.
use super::conn::{UnixConn, dial_by};
use super::{Conn, WireClient, expect, server_timeout_ms, transport};
use crate::{ClientError, Result, WriteBlock, WriteResult};
use bytes::Bytes;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{HEADER_LEN, Header, Kind, read_exact_bytes, write_all_vectored};
use kvtier_shm::Mapping;
use prost::Message;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Bytes one thread copies before another is worth starting.
const PER_THREAD: usize = 8 << 20;

/// Most threads one call copies with.
const MAX_THREADS: usize = 8;

/// A reply frame of a shared-memory request, with the descriptors that
/// came with it.
pub(super) struct Reply {
    pub(super) header: Header,
    pub(super) meta: Bytes,
    pub(super) data: Bytes,
    pub(super) fds: Vec<OwnedFd>,
}

/// One exchange on a same-host connection: the request written, the
/// reply's header received with `recvmsg` (its first byte carries any
/// descriptors), then its metadata and data.
pub(super) async fn exchange(
    c: &mut UnixConn,
    kind: Kind,
    id: u64,
    meta: &[u8],
) -> std::io::Result<Reply> {
    let header = Header {
        kind,
        request_id: id,
        meta_len: meta.len() as u32,
        data_len: 0,
    }
    .encode();
    write_all_vectored(&mut c.sock, &[&header, meta]).await?;
    let mut raw = [0u8; HEADER_LEN];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < HEADER_LEN {
        c.sock.readable().await?;
        let sock = &c.sock;
        match sock.try_io(tokio::io::Interest::READABLE, || {
            kvtier_shm::fdpass::recv(sock.as_fd(), &mut raw[got..], &mut fds)
        }) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    let h = Header::decode(&raw)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    if h.request_id != id && h.kind != Kind::Error {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("reply to request {} while waiting for {id}", h.request_id),
        ));
    }
    let m = read_exact_bytes(&mut c.sock, h.meta_len as usize).await?;
    let data = read_exact_bytes(&mut c.sock, h.data_len as usize).await?;
    Ok(Reply {
        header: h,
        meta: m,
        data,
        fds,
    })
}

/// This client's mappings of the server's segments, by id, shared by its
/// connections (the server sends a segment's descriptor once per
/// connection; a second one for a segment already mapped is closed): a
/// segment keeps one address in this process while it is mapped, which a
/// GPU engine registers once.
pub(super) type Maps = parking_lot::Mutex<std::collections::HashMap<u64, Arc<Mapping>>>;

/// Forgets the segments a reply says were retired and maps the ones it
/// announced (their descriptors in order), read-only.
pub(super) fn map_new(
    maps: &Maps,
    segs: &[pb::WireSegment],
    fds: Vec<OwnedFd>,
    retired: &[u64],
) -> std::io::Result<()> {
    check_fds(segs, &fds)?;
    let mut maps = maps.lock();
    for id in retired {
        maps.remove(id);
    }
    for (s, fd) in segs.iter().zip(fds) {
        if let std::collections::hash_map::Entry::Vacant(e) = maps.entry(s.id) {
            e.insert(Arc::new(Mapping::new(fd, s.len as usize, false)?));
        }
    }
    Ok(())
}

fn check_fds(segs: &[pb::WireSegment], fds: &[OwnedFd]) -> std::io::Result<()> {
    if segs.len() != fds.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} segments announced, {} descriptors received",
                segs.len(),
                fds.len()
            ),
        ));
    }
    Ok(())
}

/// The mapping of each slot's segment (`None` for a block in the reply).
pub(super) fn mappings_of(
    maps: &Maps,
    slots: &[pb::WireSlot],
) -> Option<Vec<Option<Arc<Mapping>>>> {
    let maps = maps.lock();
    slots
        .iter()
        .map(|s| {
            if s.segment == 0 {
                Some(None)
            } else {
                maps.get(&s.segment).cloned().map(Some)
            }
        })
        .collect()
}

/// CPUs this machine has online: not `available_parallelism`, which is the
/// calling thread's affinity, and engines bind their threads to one core
/// each (vLLM's CPU backend binds its OpenMP threads, the caller's among
/// them).
fn cores() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .map_or(1, |n| n.max(1) as usize)
}

/// Lets a copy thread run on every CPU this process may use (the kernel
/// keeps it within the process's cpuset): a thread inherits its creator's
/// affinity, which in an engine that binds its threads is one core, and
/// every copy thread would share it.
fn unbind() {
    let mut all = nix::sched::CpuSet::new();
    for i in 0..nix::sched::CpuSet::count() {
        let _ = all.set(i);
    }
    let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &all);
}

/// Copies each `(source, destinations)` pair, the destinations filled in
/// order; on several threads when there is enough to copy.
fn copy_all(jobs: &mut [(&[u8], &mut Vec<&mut [u8]>)]) {
    fn one(src: &[u8], dst: &mut [&mut [u8]]) {
        let mut at = 0;
        for d in dst.iter_mut() {
            if at == src.len() {
                break;
            }
            let n = d.len().min(src.len() - at);
            d[..n].copy_from_slice(&src[at..at + n]);
            at += n;
        }
    }
    let bytes: usize = jobs.iter().map(|(s, _)| s.len()).sum();
    on_threads(jobs, bytes, |run| {
        for (s, d) in run.iter_mut() {
            one(s, d);
        }
    });
}

/// Runs `run` over `jobs` cut into one run per thread: as many threads as
/// `bytes` is worth (one per [`PER_THREAD`]), at most one per online CPU and
/// [`MAX_THREADS`]; each thread first leaves its creator's binding.
fn on_threads<T: Send>(jobs: &mut [T], bytes: usize, run: impl Fn(&mut [T]) + Sync) {
    let threads = (bytes / PER_THREAD)
        .clamp(1, MAX_THREADS)
        .min(cores())
        .min(jobs.len().max(1));
    if threads <= 1 {
        return run(jobs);
    }
    let per = jobs.len().div_ceil(threads);
    let run = &run;
    std::thread::scope(|sc| {
        for chunk in jobs.chunks_mut(per) {
            sc.spawn(move || {
                unbind();
                run(chunk)
            });
        }
    });
}

/// Copies the payloads into the lent segment, one after another from its
/// start; on several threads when there is enough to copy.
fn fill(map: &Mapping, blocks: &[WriteBlock]) {
    let mut at = 0usize;
    let mut jobs: Vec<(usize, &[u8])> = blocks
        .iter()
        .map(|b| {
            let off = at;
            at += b.payload.len();
            (off, &b.payload[..])
        })
        .collect();
    on_threads(&mut jobs, at, |run| {
        for &mut (off, p) in run {
            map.put(off, p);
        }
    });
}

/// Runs `f` where blocking is allowed: on a multi-threaded runtime the
/// worker hands its other tasks off first.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl WireClient {
    /// A connection from the pool (or a new one), with its pool slot.
    pub(super) async fn checkout(
        &self,
        deadline: Instant,
    ) -> Result<(tokio::sync::SemaphorePermit<'_>, Conn)> {
        self.checkout_for(deadline, None).await
    }

    /// [`WireClient::checkout`]; for a save of `lent` bytes, an idle
    /// connection already lent a segment that large comes first (a new
    /// one costs a segment faulted in from fresh memory).
    async fn checkout_for(
        &self,
        deadline: Instant,
        lent: Option<u64>,
    ) -> Result<(tokio::sync::SemaphorePermit<'_>, Conn)> {
        let slot = self.slots.acquire().await.expect("never closed");
        let conn = match lent
            .and_then(|want| self.take_idle_lent(want))
            .or_else(|| self.take_idle())
        {
            Some(c) => c,
            None => {
                dial_by(
                    deadline.min(Instant::now() + self.connect_timeout),
                    &self.addr,
                    self.congestion.as_deref(),
                    self.token.as_deref(),
                    self.tls.as_ref(),
                    self.server_uid,
                )
                .await?
            }
        };
        Ok((slot, conn))
    }

    /// An idle connection lent a segment of at least `want` bytes, if any
    /// (never in a forked child: `take_idle` gives it its own).
    fn take_idle_lent(&self, want: u64) -> Option<Conn> {
        if self.owner.load(Ordering::Acquire) != u64::from(std::process::id()) {
            return None;
        }
        let mut idle = self.idle.lock();
        let at = idle.iter().rposition(|c| {
            matches!(c, Conn::Unix(u) if u.lent.as_ref().is_some_and(|(_, m)| m.len() as u64 >= want))
        })?;
        Some(idle.swap_remove(at))
    }

    /// Puts a connection back in the pool.
    pub(super) fn give_back(&self, c: Conn) {
        self.idle.lock().push(c);
    }

    /// One shared-memory exchange on a pooled same-host connection, then
    /// `then` with the reply and the connection (to map and copy), all
    /// before `deadline`. The connection goes back to the pool only after
    /// a reply that leaves it usable.
    async fn on_local<T>(
        &self,
        kind: Kind,
        meta: Vec<u8>,
        (deadline, lent): (Instant, Option<u64>),
        then: impl AsyncFnOnce(&mut UnixConn, Reply) -> Result<T>,
    ) -> Result<T> {
        let r = tokio::time::timeout_at(deadline.into(), async {
            let (_slot, conn) = self.checkout_for(deadline, lent).await?;
            let Conn::Unix(mut c) = conn else {
                return Err(ClientError::Invalid(
                    "shared memory is only on the same-host socket".into(),
                ));
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let reply = match exchange(&mut c, kind, id, &meta).await {
                Ok(r) => r,
                Err(e) => {
                    self.idle.lock().clear();
                    return Err(transport(e, &self.addr));
                }
            };
            let keep = reply.header.kind != Kind::Error;
            let out = then(&mut c, reply).await;
            if keep && !matches!(out, Err(ClientError::Unreachable { .. })) {
                self.idle.lock().push(Conn::Unix(c));
            }
            out
        })
        .await;
        r.unwrap_or_else(|_| {
            Err(ClientError::Status(tonic::Status::deadline_exceeded(
                format!(
                    "data plane {}: no answer within {:?}",
                    self.addr, self.timeout
                ),
            )))
        })
    }

    /// A read of `keys` into `dests` through shared memory: the reply's
    /// blocks copied out of the mapped segments (or the frame, for blocks
    /// the server had no shared memory for), then the lease released.
    pub(super) async fn read_mapped(
        &self,
        read: pb::WireReadRequest,
        dests: &mut [Vec<&mut [u8]>],
        deadline: Instant,
    ) -> Result<pb::WireReadReply> {
        let addr = self.addr.clone();
        let release_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.on_local(
            Kind::MapRead,
            read.encode_to_vec(),
            (deadline, None),
            async |c, r| {
                expect(r.header.kind, Kind::MapReadReply, &r.meta)?;
                let m = pb::WireMapReadReply::decode(r.meta).map_err(|e| transport(e, &addr))?;
                map_new(&self.maps, &m.segments, r.fds, &m.retired)
                    .map_err(|e| transport(e, &addr))?;
                let held = mappings_of(&self.maps, &m.slots)
                    .ok_or_else(|| transport("a slot in a segment never sent", &addr))?;
                let read = m.read.unwrap_or_default();
                if read.blocks.len() != m.slots.len()
                    || read.payload_lengths.len() != m.slots.len()
                    || dests.len() < m.slots.len()
                {
                    return Err(transport("a MapRead reply with mismatched lists", &addr));
                }
                let mut jobs: Vec<(&[u8], &mut Vec<&mut [u8]>)> = Vec::with_capacity(m.slots.len());
                let mut inline = 0usize;
                for (((slot, &len), d), map) in m
                    .slots
                    .iter()
                    .zip(&read.payload_lengths)
                    .zip(dests.iter_mut())
                    .zip(&held)
                {
                    let src: &[u8] = if slot.segment == 0 {
                        let s = r.data.get(inline..inline + len as usize).ok_or_else(|| {
                            transport("a MapRead reply shorter than its blocks", &addr)
                        })?;
                        inline += len as usize;
                        s
                    } else {
                        map.as_ref()
                            .and_then(|map| map.get(slot.offset, len))
                            .ok_or_else(|| transport("a slot outside the segments sent", &addr))?
                    };
                    let room: usize = d.iter().map(|p| p.len()).sum();
                    if room < src.len() {
                        return Err(ClientError::Status(tonic::Status::invalid_argument(
                            format!(
                                "buffer {} holds fewer bytes than its block ({len})",
                                jobs.len()
                            ),
                        )));
                    }
                    jobs.push((src, d));
                }
                blocking(|| copy_all(&mut jobs));
                drop(jobs);
                if m.lease != 0 {
                    let rel = pb::WireRelease {
                        leases: vec![m.lease],
                    };
                    let done = exchange(c, Kind::Release, release_id, &rel.encode_to_vec())
                        .await
                        .map_err(|e| transport(e, &addr))?;
                    expect(done.header.kind, Kind::ReleaseReply, &done.meta)?;
                }
                Ok(read)
            },
        )
        .await
    }

    /// A write of `blocks` through the segment the server lent this
    /// connection (asked for, or for a larger one, first when needed).
    /// `Ok(None)`: the server has no shared memory to lend now; send Write.
    pub(super) async fn write_lent(
        &self,
        write: pb::WireWriteRequest,
        blocks: &[WriteBlock],
        deadline: Instant,
    ) -> Result<Option<WriteResult>> {
        let total: u64 = blocks.iter().map(|b| b.payload.len() as u64).sum();
        let addr = self.addr.clone();
        let write_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut w = write;
        w.timeout_ms = server_timeout_ms(deadline);
        let lend = pb::WireLend { len: total.max(1) };
        // Asked for on the connection the write goes on: the lent segment is
        // that connection's.
        self.on_local(
            Kind::Lend,
            lend.encode_to_vec(),
            (deadline, Some(total)),
            async |c, r| {
                if let Err(e) = expect(r.header.kind, Kind::LendReply, &r.meta) {
                    if e.code() == Some(tonic::Code::ResourceExhausted) {
                        return Ok(None);
                    }
                    return Err(e);
                }
                let lent = pb::WireLent::decode(r.meta).map_err(|e| transport(e, &addr))?;
                let seg = lent.segment.unwrap_or_default();
                let had_fds = !r.fds.is_empty();
                if had_fds {
                    check_fds(std::slice::from_ref(&seg), &r.fds)
                        .map_err(|e| transport(e, &addr))?;
                    let fd = r.fds.into_iter().next().expect("checked");
                    let map = Mapping::new(fd, seg.len as usize, true)
                        .map_err(|e| transport(e, &addr))?;
                    c.lent = Some((seg.id, map));
                } else if c.lent.as_ref().is_none_or(|(id, _)| *id != seg.id) {
                    return Err(transport("a lent segment without its descriptor", &addr));
                }
                let (_, map) = c.lent.as_ref().expect("checked above");
                blocking(|| fill(map, blocks));
                let f = exchange(c, Kind::WriteLent, write_id, &w.encode_to_vec())
                    .await
                    .map_err(|e| transport(e, &addr))?;
                expect(f.header.kind, Kind::WriteReply, &f.meta)?;
                let r = pb::WriteResponse::decode(f.meta).map_err(|e| transport(e, &addr))?;
                Ok(Some(WriteResult {
                    stored: r.stored,
                    existing: r.existing,
                    deferred: r.deferred,
                    timing: r.timing.unwrap_or_default(),
                }))
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;

    /// An engine that binds its threads to one core each must not get every
    /// copy thread on that core: the copy counts the machine's CPUs, not
    /// its caller's, and each copy thread widens its own affinity.
    #[test]
    fn copy_threads_leave_a_callers_one_core_binding() {
        let online = cores();
        std::thread::spawn(move || {
            let mut one = CpuSet::new();
            one.set(0).unwrap();
            sched_setaffinity(Pid::from_raw(0), &one).unwrap();
            assert_eq!(
                cores(),
                online,
                "counted from the machine, not the bound caller"
            );
            let widened = std::thread::spawn(|| {
                unbind();
                let got = sched_getaffinity(Pid::from_raw(0)).unwrap();
                (0..CpuSet::count())
                    .filter(|&i| got.is_set(i).unwrap_or(false))
                    .count()
            })
            .join()
            .unwrap();
            let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
            assert_eq!(allowed, 1, "the caller stays bound");
            if online > 1 {
                assert!(
                    widened > 1,
                    "a copy thread of a one-core caller runs on {widened} CPU"
                );
            }
        })
        .join()
        .unwrap();
    }
}
