//! `kvtier.v1` messages to and from core types, shared by every front that
//! speaks them (gRPC, the data plane, the fuzzers): none of them depends on
//! another to decode a block.
use crate::refusal::Refusal;
use bytes::Bytes;
use kvtier_core::{Block, BlockId, Key, Namespace, TierKind};
use kvtier_proto::v1 as pb;

/// Most keys one Lookup / Read / Delete may name (also checked before
/// decoding, with the token limit: `kvtier_proto::bounded`).
pub use kvtier_proto::bounded::MAX_KEYS_PER_REQUEST;

/// Wire value of a tier.
pub fn tier(k: TierKind) -> i32 {
    match k {
        TierKind::Memory => pb::Tier::Memory as i32,
        TierKind::Disk => pb::Tier::Disk as i32,
        TierKind::Object => pb::Tier::Object as i32,
        TierKind::Peer => pb::Tier::Peer as i32,
    }
}

/// `LookupResponse.nodes` and `tier_counts` for a lookup's `places`
/// (`this`: this node's name).
pub fn placement(
    places: &[(TierKind, Option<String>)],
    this: &str,
) -> (Vec<String>, Vec<pb::TierCount>) {
    let nodes: Vec<String> = places
        .iter()
        .map(|(t, n)| match (t, n) {
            (TierKind::Object, _) => String::new(),
            (_, Some(n)) => n.clone(),
            (_, None) => this.to_string(),
        })
        .collect();
    let mut counts: Vec<pb::TierCount> = Vec::new();
    for (i, ((t, _), node)) in places.iter().zip(&nodes).enumerate() {
        let leading = nodes[..i].iter().all(|n| n == node);
        let tier = self::tier(*t);
        match counts
            .iter_mut()
            .find(|c| c.node == *node && c.tier == tier)
        {
            Some(c) => {
                c.blocks += 1;
                c.leading += leading as u32;
            }
            None => counts.push(pb::TierCount {
                node: node.clone(),
                tier,
                blocks: 1,
                leading: leading as u32,
            }),
        }
    }
    (nodes, counts)
}

/// Milliseconds left of `b`'s TTL; 0 when it has none (an expired block is
/// never served, so at least 1 otherwise).
pub fn ttl_left(b: &Block) -> u64 {
    b.meta.expires_unix_ms.map_or(0, |t| {
        t.saturating_sub(kvtier_core::clock::unix_ms()).max(1)
    })
}

/// Refuses a request naming more than [`MAX_KEYS_PER_REQUEST`] keys.
pub fn check_count(n: usize) -> Result<(), Refusal> {
    if n > MAX_KEYS_PER_REQUEST {
        return Err(Refusal::invalid(format!(
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
) -> Result<Block, Refusal> {
    if b.payload.len() as u64 > max_size {
        return block_from_pb_checked(ns, i, b, max_size, 0); // refused there, uncopied
    }
    // A decoded gRPC message's bytes fields are slices of tonic's receive
    // buffer, which grows by doubling and holds the whole message: a stored
    // slice, even a 32-byte key, would keep all of it alive for as long as
    // the block lives. Under a write flood that pinned 2.2x the stored bytes
    // (notes/024). The block keeps exact-size copies instead, and the
    // receive buffer is reused for the next message. (The data plane
    // receives each payload into its own exact-size buffer and needs none.)
    let b = pb::Block {
        key: Bytes::copy_from_slice(&b.key),
        parent_key: Bytes::copy_from_slice(&b.parent_key),
        payload: Bytes::copy_from_slice(&b.payload),
        ..b
    };
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
) -> Result<Block, Refusal> {
    let at = format!("blocks[{i}]");
    if !b.token_ids.is_empty() && b.token_ids.len() != b.token_count as usize {
        return Err(Refusal::invalid(format!(
            "{at}: {} token_ids for token_count {}; send none, or one per token",
            b.token_ids.len(),
            b.token_count
        )));
    }
    let key = Key::new(b.key).map_err(|e| Refusal::from(e.context(&at)))?;
    if b.payload.len() as u64 > max_size {
        return Err(Refusal::invalid(format!(
            "{at}: payload of {} bytes exceeds the maximum block size of {max_size} bytes",
            b.payload.len()
        )));
    }
    let parent = if b.parent_key.is_empty() {
        None
    } else {
        Some(
            Key::new(b.parent_key)
                .map_err(|e| Refusal::from(e.context(format!("{at}: parent_key"))))?,
        )
    };
    if parent.as_ref() == Some(&key) {
        return Err(Refusal::invalid(format!(
            "{at}: parent_key equals key: a block cannot be its own parent \
             (the first block of a chain has an empty parent_key)"
        )));
    }
    let mut block = Block::with_computed_checksum(
        BlockId::new(ns.clone(), key),
        parent,
        b.token_count,
        b.crc32c,
        actual,
        b.payload,
    )
    .map_err(|e| Refusal::from(e.context(&at)))?;
    block.meta.expire_after_ms(b.ttl_ms);
    if !b.token_ids.is_empty() {
        block.tokens = Some(b.token_ids.into());
    }
    Ok(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_counts_blocks_and_each_nodes_leading_run() {
        let b = |n: &str| Some(n.to_string());
        let places = [
            (TierKind::Memory, None),
            (TierKind::Disk, None),
            (TierKind::Memory, b("n2")),
            (TierKind::Memory, None),
            (TierKind::Object, None),
        ];
        let (nodes, counts) = placement(&places, "n1");
        assert_eq!(nodes, ["n1", "n1", "n2", "n1", ""]);
        let got: Vec<(String, i32, u32, u32)> = counts
            .into_iter()
            .map(|c| (c.node, c.tier, c.blocks, c.leading))
            .collect();
        let (m, d, o) = (
            pb::Tier::Memory as i32,
            pb::Tier::Disk as i32,
            pb::Tier::Object as i32,
        );
        assert_eq!(
            got,
            vec![
                ("n1".into(), m, 2, 1),
                ("n1".into(), d, 1, 1),
                ("n2".into(), m, 1, 0),
                ("".into(), o, 1, 0),
            ]
        );
    }

    /// Whether `part` points into `whole`'s bytes.
    fn within(part: &[u8], whole: &Bytes) -> bool {
        let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
        p >= w && p < w + whole.len()
    }

    #[test]
    fn a_grpc_block_keeps_no_slice_of_the_receive_buffer() {
        // As prost decodes a message: every bytes field a slice of one buffer.
        let payload = vec![7u8; 4096];
        let mut buf = Vec::new();
        buf.extend_from_slice(b"key-0001parent-1");
        buf.extend_from_slice(&payload);
        buf.extend_from_slice(&[0u8; 8192]); // the rest of the message
        let whole = Bytes::from(buf);
        let b = pb::Block {
            key: whole.slice(0..8),
            parent_key: whole.slice(8..16),
            payload: whole.slice(16..16 + payload.len()),
            crc32c: crc32c::crc32c(&payload),
            ..Default::default()
        };
        let ns = Namespace::new("n").unwrap();
        let block = block_from_pb(&ns, 0, b, 1 << 20).unwrap();
        assert_eq!(&block.payload[..], &payload[..]);
        assert_eq!(block.meta.id.key.as_bytes(), b"key-0001");
        assert!(!within(&block.payload, &whole), "payload shares the buffer");
        assert!(
            !within(block.meta.id.key.as_bytes(), &whole),
            "key shares it"
        );
        let parent = block.meta.parent.as_ref().unwrap();
        assert!(!within(parent.as_bytes(), &whole), "parent shares it");
    }

    #[test]
    fn a_block_that_is_its_own_parent_is_refused() {
        let b = pb::Block {
            key: Bytes::from_static(b"k1"),
            parent_key: Bytes::from_static(b"k1"),
            payload: Bytes::from_static(b"x"),
            crc32c: crc32c::crc32c(b"x"),
            ..Default::default()
        };
        let ns = Namespace::new("n").unwrap();
        let e = block_from_pb(&ns, 3, b, 1 << 20).unwrap_err();
        assert_eq!(e.kind, crate::refusal::Kind::InvalidArgument);
        assert!(
            e.message.contains("blocks[3]: parent_key equals key"),
            "{e:?}"
        );
    }
}
