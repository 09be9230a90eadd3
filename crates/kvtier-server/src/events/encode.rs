//! KV events as vLLM encodes them (`vllm.distributed.kv_events`, msgspec
//! msgpack), so vLLM's own decoder and the routers built on it (llm-d's
//! indexer, Dynamo) read kvtier's events unchanged.
//!
//! `KVEventBatch` is an array-like struct: `[ts, [event, ...], 0]` (the
//! last, `data_parallel_rank`, is 0 as vLLM's publisher sets it). Each event is
//! a map tagged by `"type"`, fields in vLLM's declaration order; fields with
//! no default are always written (as nil when unset), defaulted ones only
//! when set. Block hashes are msgpack int64 always (marker 0xd3): llm-d
//! accepts a hash as bytes or a 64-bit integer and refuses the small
//! unsigned forms msgpack would otherwise pick. See docs/events.md.
use kvtier_core::events::Medium;
use kvtier_core::{BlockId, Key, Namespace};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// One event, before encoding.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `BlockStored`: one block now in `medium`.
    Stored {
        /// [`block_hash`] of the block.
        hash: i64,
        /// [`block_hash`] of its chain parent, if any.
        parent: Option<i64>,
        /// The block's tokens; `None` when its writer sent none.
        tokens: Option<Arc<[u32]>>,
        /// Where it is now.
        medium: Medium,
    },
    /// `BlockRemoved`: one block left `medium`.
    Removed {
        /// [`block_hash`] of the block.
        hash: i64,
        /// Where it was.
        medium: Medium,
    },
    /// `AllBlocksCleared`: forget everything this node announced.
    Cleared,
}

/// The wire name of a medium (`medium` in vLLM's events).
pub fn medium_name(m: Medium) -> &'static str {
    match m {
        Medium::Memory => "CPU",
        Medium::Disk => "DISK",
        Medium::Object => "STORAGE",
    }
}

/// `locality` in vLLM's events: this node's own tiers are local, the
/// object store every node shares is remote.
fn locality(m: Medium) -> &'static str {
    match m {
        Medium::Object => "REMOTE",
        _ => "LOCAL",
    }
}

/// The hash a block is published under: the first 8 bytes, big-endian, of
/// sha256(namespace ‖ 0x00 ‖ key), as a signed integer; never 0, which
/// consumers read as "no parent". The same block has the same hash on every
/// node, so a chain split over a cluster's nodes still links up.
pub fn block_hash(ns: &Namespace, key: &Key) -> i64 {
    let mut h = Sha256::new();
    h.update(ns.as_str().as_bytes());
    h.update([0u8]);
    h.update(key.as_bytes());
    let d = h.finalize();
    match i64::from_be_bytes(d[..8].try_into().expect("8 bytes")) {
        0 => 1,
        v => v,
    }
}

/// [`block_hash`] of a block id.
pub fn hash_of(id: &BlockId) -> i64 {
    block_hash(&id.namespace, &id.key)
}

/// Encodes one `KVEventBatch` at `ts` (Unix seconds); `ownership` names the
/// node (`kvtier:<node>`).
pub fn encode_batch(ts: f64, events: &[Event], ownership: &str) -> Vec<u8> {
    let mut w = Vec::with_capacity(64 + events.len() * 96);
    let ok = write_batch(&mut w, ts, events, ownership);
    debug_assert!(ok.is_ok(), "writing to a Vec cannot fail");
    w
}

type W = Vec<u8>;
type R = Result<(), rmp::encode::ValueWriteError>;

fn write_batch(w: &mut W, ts: f64, events: &[Event], ownership: &str) -> R {
    rmp::encode::write_array_len(w, 3)?;
    rmp::encode::write_f64(w, ts)?;
    rmp::encode::write_array_len(w, events.len() as u32)?;
    for e in events {
        write_event(w, e, ownership)?;
    }
    // data_parallel_rank: vLLM's publisher always sets it (0 without data
    // parallelism), and llm-d decodes the batch as exactly three fields.
    rmp::encode::write_uint(w, 0)?;
    Ok(())
}

fn kv_str(w: &mut W, k: &str, v: &str) -> R {
    rmp::encode::write_str(w, k)?;
    rmp::encode::write_str(w, v)?;
    Ok(())
}

fn kv_nil(w: &mut W, k: &str) -> R {
    rmp::encode::write_str(w, k)?;
    rmp::encode::write_nil(w).map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite)?;
    Ok(())
}

fn write_event(w: &mut W, e: &Event, ownership: &str) -> R {
    match e {
        Event::Stored {
            hash,
            parent,
            tokens,
            medium,
        } => {
            rmp::encode::write_map_len(w, 10)?;
            kv_str(w, "type", "BlockStored")?;
            rmp::encode::write_str(w, "block_hashes")?;
            rmp::encode::write_array_len(w, 1)?;
            rmp::encode::write_i64(w, *hash)?;
            match parent {
                Some(p) => {
                    rmp::encode::write_str(w, "parent_block_hash")?;
                    rmp::encode::write_i64(w, *p)?;
                }
                None => kv_nil(w, "parent_block_hash")?,
            }
            let toks: &[u32] = tokens.as_deref().unwrap_or(&[]);
            rmp::encode::write_str(w, "token_ids")?;
            rmp::encode::write_array_len(w, toks.len() as u32)?;
            for &t in toks {
                rmp::encode::write_uint(w, t as u64)?;
            }
            rmp::encode::write_str(w, "block_size")?;
            rmp::encode::write_uint(w, toks.len() as u64)?;
            kv_nil(w, "lora_id")?;
            kv_str(w, "medium", medium_name(*medium))?;
            kv_nil(w, "lora_name")?;
            kv_str(w, "locality", locality(*medium))?;
            kv_str(w, "ownership", ownership)?;
        }
        Event::Removed { hash, medium } => {
            rmp::encode::write_map_len(w, 5)?;
            kv_str(w, "type", "BlockRemoved")?;
            rmp::encode::write_str(w, "block_hashes")?;
            rmp::encode::write_array_len(w, 1)?;
            rmp::encode::write_i64(w, *hash)?;
            kv_str(w, "medium", medium_name(*medium))?;
            kv_str(w, "locality", locality(*medium))?;
            kv_str(w, "ownership", ownership)?;
        }
        Event::Cleared => {
            rmp::encode::write_map_len(w, 1)?;
            kv_str(w, "type", "AllBlocksCleared")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_int64_on_the_wire_even_when_small() {
        let e = Event::Removed {
            hash: 5,
            medium: Medium::Disk,
        };
        let b = encode_batch(1.5, &[e], "kvtier:n");
        // [ts, [ {type, block_hashes: [5 as 0xd3 + 8 bytes], ...} ]]
        let want: &[u8] = &[0xd3, 0, 0, 0, 0, 0, 0, 0, 5];
        assert!(
            b.windows(want.len()).any(|x| x == want),
            "hash not int64-encoded: {b:02x?}"
        );
    }

    #[test]
    fn a_hash_depends_on_namespace_and_key_and_is_never_zero() {
        let k = Key::new(b"k".to_vec()).unwrap();
        let a = block_hash(&Namespace::new("a").unwrap(), &k);
        let b = block_hash(&Namespace::new("b").unwrap(), &k);
        assert_ne!(a, b);
        assert_ne!(a, 0);
    }
}
