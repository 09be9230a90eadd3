//! Reads into the caller's own buffers and writes from them: on the
//! same-host socket through shared memory (`super::local`, docs/local.md),
//! elsewhere received from the socket straight into the buffers, each
//! payload checksummed as it arrives. Writes larger than the server accepts in one
//! request are split to fit (`Stats.max_message_size`).
use super::frame::Sink;
use super::{SIZE, WireClient, add_timing, expect, server_timeout_ms, stripe_bounds, transport};
use crate::{ClientError, Result, WriteBlock, WriteResult};
use bytes::Bytes;
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use prost::Message;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A block read into the caller's buffer.
#[derive(Debug, Clone)]
pub struct FilledBlock {
    /// Position in the request (and so the buffer it is in).
    pub index: usize,
    /// Key.
    pub key: Key,
    /// Parent key.
    pub parent: Option<Key>,
    /// Tokens covered.
    pub token_count: u32,
    /// Payload bytes now at the start of the buffer.
    pub len: usize,
    /// Tier it was served from.
    pub tier: pb::Tier,
}

/// Result of a read into the caller's buffers.
#[derive(Debug, Clone)]
pub struct ReadIntoResult {
    /// Blocks in request order (a prefix of the request).
    pub blocks: Vec<FilledBlock>,
    /// True when fewer than requested were returned.
    pub partial: bool,
    /// `missing`, `deadline` or empty.
    pub reason: String,
    /// Server timing.
    pub timing: pb::ServerTiming,
}

impl WireClient {
    /// Reads `keys` in order into `dests` (block `i` into `dests[i]`, which
    /// must hold it), stopping at the first missing block; long reads are
    /// striped as [`WireClient::read`]. On the same-host socket the blocks
    /// are copied out of the server's shared memory by this process;
    /// elsewhere they are received into them, each checksum verified.
    ///
    /// Cancellation: the buffers are written only inside this call's polls,
    /// so a dropped future leaves nothing landing in them later.
    pub async fn read_into_by(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        dests: &mut [&mut [u8]],
        deadline: Instant,
    ) -> Result<ReadIntoResult> {
        let mut parts: Vec<Vec<&mut [u8]>> = dests.iter_mut().map(|d| vec![&mut **d]).collect();
        self.read_parts_by(ns, keys, lease_id, &mut parts, deadline)
            .await
    }

    /// [`WireClient::read_into_by`] for blocks whose bytes belong in several
    /// places: block `i` fills the regions `dests[i]` in order (an engine's
    /// KV cache keeps each layer apart, so a block lands in one region per
    /// layer with no staging copy between; docs/local.md).
    pub async fn read_parts_by(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        dests: &mut [Vec<&mut [u8]>],
        deadline: Instant,
    ) -> Result<ReadIntoResult> {
        if dests.len() != keys.len() {
            return Err(ClientError::Invalid(format!(
                "{} keys but {} buffers",
                keys.len(),
                dests.len()
            )));
        }
        let n = self.stripes_for(keys.len());
        let runs = stripe_bounds(keys.len(), n);
        let mut parts_of: Vec<&mut [Vec<&mut [u8]>]> = Vec::with_capacity(n);
        let mut rest = dests;
        for r in &runs {
            let (a, b) = rest.split_at_mut(r.len());
            parts_of.push(a);
            rest = b;
        }
        let parts = futures::future::join_all(
            runs.iter()
                .zip(parts_of)
                .map(|(r, d)| self.read_into_run(ns, &keys[r.clone()], lease_id, d, deadline)),
        )
        .await;
        let mut out = ReadIntoResult {
            blocks: Vec::with_capacity(keys.len()),
            partial: false,
            reason: String::new(),
            timing: Default::default(),
        };
        for (range, part) in runs.into_iter().zip(parts) {
            let part = part?;
            let complete = part.blocks.len() == range.len();
            out.blocks.extend(part.blocks.into_iter().map(|mut b| {
                b.index += range.start;
                b
            }));
            add_timing(&mut out.timing, &part.timing);
            out.reason = part.reason;
            if !complete {
                break;
            }
        }
        out.partial = out.blocks.len() < keys.len();
        Ok(out)
    }

    /// One run of keys, continuing replies that stopped for size.
    async fn read_into_run(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        dests: &mut [Vec<&mut [u8]>],
        deadline: Instant,
    ) -> Result<ReadIntoResult> {
        let mut out = ReadIntoResult {
            blocks: Vec::new(),
            partial: false,
            reason: String::new(),
            timing: Default::default(),
        };
        loop {
            let from = out.blocks.len();
            let more = self
                .read_into_once(ns, &keys[from..], lease_id, &mut dests[from..], deadline)
                .await?;
            let got = more.blocks.len();
            out.blocks.extend(more.blocks.into_iter().map(|mut b| {
                b.index += from;
                b
            }));
            add_timing(&mut out.timing, &more.timing);
            out.reason = more.reason;
            if out.reason != SIZE || out.blocks.len() >= keys.len() {
                break;
            }
            if got == 0 {
                return Err(transport(
                    "a reply ended for size without a block",
                    &self.addr,
                ));
            }
        }
        out.partial = out.blocks.len() < keys.len();
        Ok(out)
    }

    /// One request: through shared memory where the server offers it,
    /// else over the socket into the buffers.
    async fn read_into_once(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        dests: &mut [Vec<&mut [u8]>],
        deadline: Instant,
    ) -> Result<ReadIntoResult> {
        let read = super::read_request(ns, keys, lease_id, deadline);
        if self.copies_by_memory() {
            match self.read_mapped(read.clone(), dests, deadline).await {
                Ok(reply) => return self.filled_reply(reply, None),
                Err(e) if self.no_copies(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let f = self
            .call_into(
                Kind::Read,
                read.encode_to_vec(),
                &[],
                deadline,
                &mut Sink::Into(dests),
            )
            .await?;
        expect(f.header.kind, Kind::ReadReply, &f.meta)?;
        let reply = f
            .read_reply
            .ok_or_else(|| transport("read reply", &self.addr))?;
        self.filled_reply(reply, Some(f.filled))
    }

    /// The result of a reply whose payloads are in the caller's buffers;
    /// `received` (over the socket) carries each one's length and CRC32C.
    pub(super) fn filled_reply(
        &self,
        reply: pb::WireReadReply,
        received: Option<Vec<std::result::Result<(usize, u32), usize>>>,
    ) -> Result<ReadIntoResult> {
        let mut out = ReadIntoResult {
            blocks: Vec::with_capacity(reply.blocks.len()),
            partial: false,
            reason: String::new(),
            timing: Default::default(),
        };
        for (i, b) in reply.blocks.into_iter().enumerate() {
            let len =
                *reply.payload_lengths.get(i).ok_or_else(|| {
                    transport("read reply has fewer lengths than blocks", &self.addr)
                })? as usize;
            let crc = match received.as_ref().map(|r| r.get(i).copied()) {
                // Shared memory: the server verified the block when it
                // was stored, and nobody but the server can write its
                // segments (docs/local.md).
                None => None,
                Some(Some(Ok((_, crc)))) => Some(crc),
                Some(Some(Err(j))) => {
                    return Err(ClientError::Invalid(format!(
                        "buffer {j} holds fewer bytes than its block ({len})"
                    )));
                }
                Some(None) => return Err(transport("read reply: payload missing", &self.addr)),
            };
            let tier = b.tier;
            let index = b.index as usize;
            let blk = b
                .block
                .ok_or_else(|| transport("a ReadBlock without a block", &self.addr))?;
            if let Some(actual) = crc
                && actual != blk.crc32c
            {
                return Err(ClientError::Status(tonic::Status::data_loss(format!(
                    "block {} arrived with crc32c {actual:#010x}, expected {:#010x}",
                    hex::encode(&blk.key),
                    blk.crc32c
                ))));
            }
            out.blocks.push(FilledBlock {
                index,
                key: Key::new(blk.key).map_err(|e| ClientError::Invalid(e.message))?,
                parent: (!blk.parent_key.is_empty())
                    .then(|| Key::new(blk.parent_key))
                    .transpose()
                    .map_err(|e| ClientError::Invalid(e.message))?,
                token_count: blk.token_count,
                len,
                tier: pb::Tier::try_from(tier).unwrap_or_default(),
            });
        }
        if let Some(d) = reply.done {
            out.partial = d.partial;
            out.reason = d.reason;
            out.timing = d.timing.unwrap_or_default();
        }
        Ok(out)
    }

    /// Whether `e` says the server cannot share memory with this process
    /// (its reason `no_memory_copy`, and nothing else: an expired lease or a
    /// conflicting block is the request's problem, not the transport's);
    /// if so, shared memory is off for this pool from now on (logged once,
    /// naming the reason) and the caller falls back to the socket.
    fn no_copies(&self, e: &ClientError) -> bool {
        if !is_no_memory_copy(e) {
            return false;
        }
        if self.copies.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                target = %self.addr,
                error = %e,
                "kvtier: the server cannot share memory with this process (no_memory_copy); \
                 payloads go through the socket"
            );
        }
        true
    }

    /// Writes blocks, split into requests of at most `max_request` bytes
    /// each; through shared memory on the same-host socket.
    pub(super) async fn write_split(
        &self,
        ns: &str,
        blocks: &[WriteBlock],
        deadline: Instant,
    ) -> Result<WriteResult> {
        let max = self.max_request.load(Ordering::Relaxed).max(1);
        // A block that alone exceeds the limit can never be stored: say so
        // before anything is sent (the server would refuse the frame).
        if let Some((i, b)) = blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.payload.len() as u64 + 256 > max)
        {
            return Err(ClientError::Invalid(format!(
                "block {i} is {} bytes, more than the server accepts in one request \
                 ({max} bytes, its server.max_message_size)",
                b.payload.len()
            )));
        }
        let mut batches = Vec::new();
        let mut start = 0;
        while start < blocks.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < blocks.len() {
                // Room for each block's metadata besides its payload.
                let size = blocks[end].payload.len() as u64 + 256;
                if end > start && bytes + size > max {
                    break;
                }
                bytes += size;
                end += 1;
            }
            batches.push(start..end);
            start = end;
        }
        // One after another: each is close to the server's limit, and the
        // server holds a request's bytes within `server.request_memory`
        // (256 MiB by default, as `max_message_size`), so two at once would
        // have the second shed, and retried, and shed again.
        let mut total = WriteResult {
            stored: 0,
            existing: 0,
            deferred: 0,
            timing: Default::default(),
        };
        for r in batches {
            let r = self.write_one(ns, &blocks[r], deadline).await?;
            total.stored += r.stored;
            total.deferred += r.deferred;
            total.existing += r.existing;
            add_timing(&mut total.timing, &r.timing);
        }
        Ok(total)
    }

    async fn write_one(
        &self,
        ns: &str,
        blocks: &[WriteBlock],
        deadline: Instant,
    ) -> Result<WriteResult> {
        let write = pb::WireWriteRequest {
            request: Some(pb::WriteRequest {
                namespace: ns.to_string(),
                blocks: blocks.iter().map(|b| b.to_pb(Bytes::new())).collect(),
            }),
            payload_lengths: blocks.iter().map(|b| b.payload.len() as u64).collect(),
            timeout_ms: server_timeout_ms(deadline),
        };
        if self.copies_by_memory() {
            match self.write_lent(write.clone(), blocks, deadline).await {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {} // no shared memory to lend now: through the socket
                Err(e) if self.no_copies(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let data: Vec<Bytes> = blocks.iter().map(|b| b.payload.clone()).collect();
        let f = self
            .call(Kind::Write, write.encode_to_vec(), &data, deadline)
            .await?;
        expect(f.header.kind, Kind::WriteReply, &f.meta)?;
        let r = pb::WriteResponse::decode(f.meta).map_err(|e| transport(e, &self.addr))?;
        Ok(WriteResult {
            stored: r.stored,
            existing: r.existing,
            deferred: r.deferred,
            timing: r.timing.unwrap_or_default(),
        })
    }
}

/// Whether `e` is the server's "cannot copy into your process" refusal.
pub(crate) fn is_no_memory_copy(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) => {
            s.code() == tonic::Code::FailedPrecondition
                && s.metadata()
                    .get(super::REASON)
                    .is_some_and(|v| v == "no_memory_copy")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::expect;
    use super::*;

    /// Only the reason `no_memory_copy` says "the server cannot copy into
    /// this process"; another FAILED_PRECONDITION (an expired lease, a
    /// conflicting block) is the request's and leaves copies on.
    #[test]
    fn only_the_no_memory_copy_reason_turns_copies_off() {
        let refused = |reason: &str| {
            let meta = Bytes::from(
                pb::WireError {
                    code: tonic::Code::FailedPrecondition as i32,
                    message: "lease 7 is unknown or expired".into(),
                    retry_pushback_ms: 0,
                    reason: reason.into(),
                }
                .encode_to_vec(),
            );
            expect(Kind::Error, Kind::MapReadReply, &meta).unwrap_err()
        };
        assert!(is_no_memory_copy(&refused("no_memory_copy")));
        assert!(!is_no_memory_copy(&refused("")));
        assert!(!is_no_memory_copy(&refused("no_memory_copy_")));
    }
}
