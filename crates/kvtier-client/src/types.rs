//! What the client's calls take and return (lookups, blocks to write,
//! blocks read) and their conversion from the kvtier.v1 messages.

use super::*;

/// Result of a lookup.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// Leading blocks present.
    pub found: usize,
    /// Tier of each found block.
    pub tiers: Vec<Tier>,
    /// The keys checked (computed client-side for token lookups).
    pub keys: Vec<Key>,
    /// Lease id (0 = none).
    pub lease_id: u64,
    /// Server timing.
    pub timing: ServerTiming,
    /// The node holding each found block ("" = the object store).
    pub nodes: Vec<String>,
    /// Per node and tier: blocks of the found prefix there, and how many of
    /// them are in that node's leading run (docs/events.md, "Per-tier lookup").
    pub tier_counts: Vec<TierCount>,
}

/// One entry of [`Lookup::tier_counts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierCount {
    /// The node ("" = the object store).
    pub node: String,
    /// The tier.
    pub tier: Tier,
    /// Blocks of the found prefix at this node and tier.
    pub blocks: u32,
    /// Of those, the ones in the node's run from the first block.
    pub leading: u32,
}

/// One block to write.
#[derive(Debug, Clone)]
pub struct WriteBlock {
    /// Key.
    pub key: Key,
    /// Parent key (`None` for a chain head).
    pub parent: Option<Key>,
    /// Tokens covered.
    pub token_count: u32,
    /// Payload.
    pub payload: Bytes,
    /// TTL (0 = none).
    pub ttl_ms: u64,
    /// The block's token ids, so the server's KV events can name them
    /// (docs/events.md): empty, or one per token.
    pub token_ids: Vec<u32>,
}

impl WriteBlock {
    /// The wire form with the checksum of `self.payload`, carrying `payload`
    /// (the data plane sends payloads outside the message: it passes empty).
    pub(crate) fn to_pb(&self, payload: Bytes) -> pb::Block {
        pb::Block {
            key: self.key.bytes(),
            parent_key: self.parent.as_ref().map_or_else(Bytes::new, Key::bytes),
            token_count: self.token_count,
            crc32c: crc32c::crc32c(&self.payload),
            payload,
            ttl_ms: self.ttl_ms,
            token_ids: self.token_ids.clone(),
        }
    }
}

/// One block read.
#[derive(Debug, Clone)]
pub struct ReadBlock {
    /// Position in the request.
    pub index: usize,
    /// Key.
    pub key: Key,
    /// Parent key.
    pub parent: Option<Key>,
    /// Tokens covered.
    pub token_count: u32,
    /// Payload (checksum verified).
    pub payload: Bytes,
    /// Tier it was served from.
    pub tier: Tier,
}

/// Result of a read.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Blocks in request order (a prefix of the request).
    pub blocks: Vec<ReadBlock>,
    /// True when fewer than requested were returned.
    pub partial: bool,
    /// `missing`, `deadline` or empty.
    pub reason: String,
    /// Server timing.
    pub timing: ServerTiming,
}

/// Result of a write.
#[derive(Debug, Clone, Copy)]
pub struct WriteResult {
    /// Newly stored.
    pub stored: u32,
    /// Already present.
    pub existing: u32,
    /// Of those, kept in the server's memory only until used again (its
    /// admission policy defers their disk or object-store copy;
    /// docs/cache-choice.md).
    pub deferred: u32,
    /// Server timing.
    pub timing: ServerTiming,
}

pub(crate) fn to_lookup(r: pb::LookupResponse, keys: Vec<Key>) -> Lookup {
    Lookup {
        // A count of leading keys found among those asked: a server that
        // claims more cannot make `&keys[..found]` panic in the caller.
        found: (r.found_blocks as usize).min(keys.len()),
        tiers: r
            .tiers
            .iter()
            .map(|t| Tier::try_from(*t).unwrap_or(Tier::Unspecified))
            .collect(),
        keys,
        lease_id: r.lease_id,
        timing: r.timing.unwrap_or_default(),
        nodes: r.nodes,
        tier_counts: r
            .tier_counts
            .into_iter()
            .map(|c| TierCount {
                node: c.node,
                tier: Tier::try_from(c.tier).unwrap_or(Tier::Unspecified),
                blocks: c.blocks,
                leading: c.leading,
            })
            .collect(),
    }
}

pub(crate) fn to_read_block(b: pb::ReadBlock) -> Result<ReadBlock, tonic::Status> {
    let actual = b
        .block
        .as_ref()
        .map_or(0, |blk| crc32c::crc32c(&blk.payload));
    to_read_block_checked(b, actual)
}

/// [`to_read_block`] for a payload whose CRC32C (`actual`) was computed while
/// it arrived.
pub(crate) fn to_read_block_checked(
    b: pb::ReadBlock,
    actual: u32,
) -> Result<ReadBlock, tonic::Status> {
    let blk = b
        .block
        .ok_or_else(|| tonic::Status::internal("server sent a ReadBlock without a block"))?;
    if actual != blk.crc32c {
        return Err(tonic::Status::data_loss(format!(
            "block {} arrived with crc32c {actual:#010x}, expected {:#010x}",
            hex::encode(&blk.key),
            blk.crc32c
        )));
    }
    let key = Key::new(blk.key).map_err(|e| tonic::Status::internal(e.message))?;
    let parent = if blk.parent_key.is_empty() {
        None
    } else {
        Key::new(blk.parent_key).ok()
    };
    Ok(ReadBlock {
        index: b.index as usize,
        key,
        parent,
        token_count: blk.token_count,
        payload: blk.payload,
        tier: Tier::try_from(b.tier).unwrap_or(Tier::Unspecified),
    })
}
