//! `kvtier.v1` messages to and from core types, shared by every front that
//! speaks them (gRPC, the data plane, the fuzzers): none of them depends on
//! another to decode a block.
use crate::status::to_status;
use kvtier_core::{Block, BlockId, Key, Namespace, TierKind};
use kvtier_proto::v1 as pb;
use tonic::Status;

/// Most keys one Lookup / Read / Delete may name.
pub const MAX_KEYS_PER_REQUEST: usize = 65_536;

/// Wire value of a tier.
pub fn tier(k: TierKind) -> i32 {
    match k {
        TierKind::Memory => pb::Tier::Memory as i32,
        TierKind::Disk => pb::Tier::Disk as i32,
        TierKind::Object => pb::Tier::Object as i32,
        TierKind::Peer => pb::Tier::Peer as i32,
    }
}

/// Milliseconds left of `b`'s TTL; 0 when it has none (an expired block is
/// never served, so at least 1 otherwise).
pub fn ttl_left(b: &Block) -> u64 {
    b.meta.expires_unix_ms.map_or(0, |t| {
        t.saturating_sub(kvtier_core::clock::unix_ms()).max(1)
    })
}

/// Refuses a request naming more than [`MAX_KEYS_PER_REQUEST`] keys.
pub fn check_count(n: usize) -> Result<(), Status> {
    if n > MAX_KEYS_PER_REQUEST {
        return Err(Status::invalid_argument(format!(
            "{n} keys in one request; the limit is {MAX_KEYS_PER_REQUEST}"
        )));
    }
    Ok(())
}

/// Converts a wire block into a verified core block (checksum checked first).
pub fn block_from_pb(
    ns: &Namespace,
    i: usize,
    b: pb::Block,
    max_size: u64,
) -> Result<Block, Status> {
    let actual = crc32c::crc32c(&b.payload);
    block_from_pb_checked(ns, i, b, max_size, actual)
}

/// [`block_from_pb`] for a payload whose CRC32C (`actual`) the caller
/// computed over exactly `b.payload` (the data plane does it while the bytes
/// arrive); it must equal the client's `b.crc32c` or nothing is stored.
pub fn block_from_pb_checked(
    ns: &Namespace,
    i: usize,
    b: pb::Block,
    max_size: u64,
    actual: u32,
) -> Result<Block, Status> {
    let at = format!("blocks[{i}]");
    let key = Key::new(b.key).map_err(|e| to_status(e.context(&at)))?;
    if b.payload.len() as u64 > max_size {
        return Err(Status::invalid_argument(format!(
            "{at}: payload of {} bytes exceeds the maximum block size of {max_size} bytes",
            b.payload.len()
        )));
    }
    let parent = if b.parent_key.is_empty() {
        None
    } else {
        Some(
            Key::new(b.parent_key)
                .map_err(|e| to_status(e.context(format!("{at}: parent_key"))))?,
        )
    };
    let mut block = Block::with_computed_checksum(
        BlockId::new(ns.clone(), key),
        parent,
        b.token_count,
        b.crc32c,
        actual,
        b.payload,
    )
    .map_err(|e| to_status(e.context(&at)))?;
    block.meta.expire_after_ms(b.ttl_ms);
    Ok(block)
}
