//! One object per block: encoding a block as an object (a version-1 record,
//! or with a codec a version-2 record whose payload is a codec frame) and
//! decoding and verifying what a store returns. Formats:
//! docs/disk-format.md; compression: docs/object-store.md#compression.
use crate::ObjectTierConfig;
use crate::codec::{self, Codec};
use bytes::Bytes;
use kvtier_core::block::{Block, BlockId};
use kvtier_core::disk::format;
use object_store::PutPayload;

/// Decoded-length limit of [`decode_object`] (the tier uses
/// [`ObjectTierConfig::max_block_size`]).
pub const DEFAULT_MAX_BLOCK_SIZE: u64 = 256 << 20;

/// The codec of namespace `ns` under `cfg` (exact entry, else the longest
/// prefix entry ending in `/` or `:`, else the default).
pub fn codec_for(cfg: &ObjectTierConfig, ns: &str) -> Codec {
    let mut best: Option<(usize, Codec)> = None;
    for (pat, c) in &cfg.compression_namespaces {
        let hit = if pat.ends_with('/') || pat.ends_with(':') {
            ns.starts_with(pat.as_str())
        } else {
            ns == pat
        };
        // An exact entry outranks any prefix (it is at least as long).
        let rank = if ns == pat { usize::MAX } else { pat.len() };
        if hit && best.is_none_or(|(r, _)| rank > r) {
            best = Some((rank, *c));
        }
    }
    best.map_or(cfg.compression, |(_, c)| c)
}

/// Decodes one object fetched for block `id` (stored as `name`): the disk
/// record header, then the payload. Anything but exactly that block, whole
/// and matching its checksum, is an error naming what is wrong; never a
/// panic (fuzzed: `fuzz/fuzz_targets/object_decode.rs` and
/// `tests/decode_fuzz.rs`).
pub fn decode_object(id: &BlockId, name: &str, buf: Bytes) -> std::result::Result<Block, String> {
    decode_object_limited(id, name, buf, DEFAULT_MAX_BLOCK_SIZE)
}

/// [`decode_object`] with the largest decoded payload a compressed object
/// may claim (refused before allocating). Version-1 objects are raw;
/// version-2 objects carry a codec frame ([`codec`]) that is checked
/// (frame CRC32C, known codec, decoded length) and decoded, and the result
/// must match the header's CRC32C.
pub fn decode_object_limited(
    id: &BlockId,
    name: &str,
    buf: Bytes,
    max_block_size: u64,
) -> std::result::Result<Block, String> {
    let h = format::decode_object_header(&buf).map_err(|e| match e {
        format::HeaderError::Short => "truncated header".to_string(),
        format::HeaderError::Corrupt(m) => m,
    })?;
    if h.meta.id != *id {
        return Err(format!(
            "object {name} holds block {:?}/{:?}",
            h.meta.id.namespace, h.meta.id.key
        ));
    }
    let total = h.header_len as u64 + h.payload_len;
    if total != buf.len() as u64 {
        return Err(format!("length {} but the header says {total}", buf.len()));
    }
    let payload = if h.version == format::VERSION_CODEC {
        let decoded = codec::decompress(&buf[h.header_len..], max_block_size)
            .map_err(|m| format!("object {name}: {m}"))?;
        Bytes::from(decoded)
    } else {
        buf.slice(h.header_len..)
    };
    let b = Block {
        meta: h.meta,
        payload,
        tokens: None,
    };
    b.verify().map_err(|e| e.message)?;
    Ok(b)
}

/// Encodes a block as one object: the disk record header, then the payload.
pub fn encode_object(block: &Block) -> PutPayload {
    let seq = kvtier_core::memory::unix_ms();
    let header = format::encode_header(&block.meta, seq, block.payload.len() as u64);
    PutPayload::from_iter([Bytes::from(header), block.payload.clone()])
}

/// Encodes a block with `codec`: a version-2 object (header, codec frame)
/// when the codec applies and gains, else [`encode_object`]'s version 1.
/// Returns the object and the bytes after its header.
pub fn encode_object_with(block: &Block, codec: Codec) -> (PutPayload, u64) {
    let Some(f) = codec::compress(&block.payload, block.meta.crc32c, codec) else {
        return (encode_object(block), block.payload.len() as u64);
    };
    let mut meta = block.meta.clone();
    // Lossy: the object vouches for the bytes a read will serve.
    meta.crc32c = f.served_crc;
    let seq = kvtier_core::memory::unix_ms();
    let len = f.bytes.len() as u64;
    let header = format::encode_header_version(&meta, seq, len, format::VERSION_CODEC);
    (
        PutPayload::from_iter([Bytes::from(header), Bytes::from(f.bytes)]),
        len,
    )
}
