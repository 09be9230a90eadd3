//! Loads that stay where they are: the blocks of a read, as addresses in the
//! server's shared memory mapped into this process, for a caller that moves
//! them itself (a GPU engine that registers the segments once with its
//! driver and DMAs each block straight into its KV cache, with no copy on
//! the CPU; docs/local.md, "Loads a GPU reads in place").
//!
//! The slots stay as they are until [`MappedRead::release`] (or the value
//! is dropped, which closes its connection and so releases them too): no
//! slot under lease is reused by the server, so the addresses stay valid
//! and their bytes unchanged while the value lives.
use super::conn::UnixConn;
use super::local::{exchange, map_new, mappings_of};
use super::{Conn, FilledBlock, WireClient, expect, transport};
use crate::{ClientError, Result};
use bytes::Bytes;
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use kvtier_shm::Mapping;
use prost::Message;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The blocks of one read, in place in the server's shared memory.
pub struct MappedRead {
    /// Blocks found, in request order (a prefix of the request).
    pub blocks: Vec<FilledBlock>,
    /// True when fewer than requested were returned.
    pub partial: bool,
    /// `missing`, `deadline`, `size` or empty.
    pub reason: String,
    /// Each block's bytes: (address in this process, length).
    regions: Vec<(usize, usize)>,
    /// The mappings the blocks are in, by segment id (held: not unmapped
    /// while this lives).
    held: Vec<(u64, Arc<Mapping>)>,
    /// Blocks the server had no shared memory for came in the reply itself.
    _inline: Bytes,
    lease: u64,
    conn: Option<Box<UnixConn>>,
    pool: WireClient,
}

impl MappedRead {
    /// Block `i`'s bytes (valid until release); `None` past the last block.
    pub fn bytes(&self, i: usize) -> Option<&[u8]> {
        let &(addr, len) = self.regions.get(i)?;
        self.held
            .iter()
            .find_map(|(_, m)| {
                let off = addr.checked_sub(m.addr())?;
                m.get(off as u64, len as u64)
            })
            .or_else(|| {
                let off = addr.checked_sub(self._inline.as_ptr() as usize)?;
                self._inline.get(off..off + len)
            })
    }

    /// Each block's (address, length) in this process, valid until release.
    pub fn regions(&self) -> &[(usize, usize)] {
        &self.regions
    }

    /// The segments this read's blocks are in, (segment id, address,
    /// length): what a GPU engine registers with its driver, once per id (a
    /// segment keeps its address while it is mapped; a new id at an address
    /// seen before is another mapping, whose old registration must go
    /// first).
    pub fn segments(&self) -> Vec<(u64, usize, usize)> {
        self.held
            .iter()
            .map(|(id, m)| (*id, m.addr(), m.len()))
            .collect()
    }

    /// Gives the slots back to the server; the connection returns to the pool.
    pub async fn release(mut self) -> Result<()> {
        let Some(mut c) = self.conn.take() else {
            return Ok(());
        };
        if self.lease != 0 {
            let rel = pb::WireRelease {
                leases: vec![self.lease],
            };
            let id = self.pool.next_id.fetch_add(1, Ordering::Relaxed);
            let done = exchange(&mut c, Kind::Release, id, &rel.encode_to_vec())
                .await
                .map_err(|e| transport(e, &self.pool.addr))?;
            expect(done.header.kind, Kind::ReleaseReply, &done.meta)?;
        }
        self.pool.give_back(Conn::Unix(c));
        Ok(())
    }
}

impl WireClient {
    /// Reads `keys` in order, stopping at the first missing block, and
    /// leaves the blocks where they are in the server's shared memory (the
    /// same-host socket only). One request: a reply cut short for size
    /// (blocks the server had no shared memory for travel in the reply)
    /// ends the result with reason `size`; read the rest with another call.
    pub async fn map_read(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        deadline: Instant,
    ) -> Result<MappedRead> {
        if !matches!(self.addr, super::Target::Unix(_)) {
            return Err(ClientError::Invalid(
                "map_read needs the same-host socket (docs/local.md)".into(),
            ));
        }
        let read = super::read_request(ns, keys, lease_id, deadline);
        let run = async {
            let (_slot, conn) = self.checkout(deadline).await?;
            let Conn::Unix(mut c) = conn else {
                return Err(ClientError::Invalid(
                    "map_read needs the same-host socket".into(),
                ));
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let r = exchange(&mut c, Kind::MapRead, id, &read.encode_to_vec())
                .await
                .map_err(|e| transport(e, &self.addr))?;
            expect(r.header.kind, Kind::MapReadReply, &r.meta)?;
            let m = pb::WireMapReadReply::decode(r.meta).map_err(|e| transport(e, &self.addr))?;
            map_new(&self.maps, &m.segments, r.fds, &m.retired)
                .map_err(|e| transport(e, &self.addr))?;
            let maps = mappings_of(&self.maps, &m.slots)
                .ok_or_else(|| transport("a slot in a segment never sent", &self.addr))?;
            let reply = m.read.unwrap_or_default();
            if reply.payload_lengths.len() != m.slots.len() {
                return Err(transport(
                    "a MapRead reply with mismatched lists",
                    &self.addr,
                ));
            }
            let mut regions = Vec::with_capacity(m.slots.len());
            let mut inline = 0usize;
            let mut held: Vec<(u64, Arc<Mapping>)> = Vec::new();
            for ((slot, &len), map) in m.slots.iter().zip(&reply.payload_lengths).zip(maps) {
                let len = len as usize;
                let at = if slot.segment == 0 {
                    let s = r.data.get(inline..inline + len).ok_or_else(|| {
                        transport("a MapRead reply shorter than its blocks", &self.addr)
                    })?;
                    inline += len;
                    s.as_ptr() as usize
                } else {
                    let map = map.expect("a slot in a segment");
                    let at = map
                        .get(slot.offset, len as u64)
                        .ok_or_else(|| transport("a slot outside the segments sent", &self.addr))?
                        .as_ptr() as usize;
                    if !held.iter().any(|(id, _)| *id == slot.segment) {
                        held.push((slot.segment, map));
                    }
                    at
                };
                regions.push((at, len));
            }
            let filled = self.filled_reply(reply, None)?;
            Ok(MappedRead {
                blocks: filled.blocks,
                partial: filled.partial,
                reason: filled.reason,
                regions,
                held,
                _inline: r.data,
                lease: m.lease,
                conn: Some(c),
                pool: self.clone(),
            })
        };
        tokio::time::timeout_at(deadline.into(), run)
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Status(tonic::Status::deadline_exceeded(
                    format!(
                        "data plane {}: no answer within {:?}",
                        self.addr, self.timeout
                    ),
                )))
            })
    }
}
