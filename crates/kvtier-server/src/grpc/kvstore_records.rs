//! How the seed service's blocks are stored in the engine: the record layout
//! behind `kvstore.KVStoreService` ([`super::kvstore`]), kept apart from the
//! gRPC handlers so the protocol file knows requests and this one knows bytes.
//!
//! The seed service addresses a block by its own 128 tokens and lets the same
//! tokens exist in several *versions* (one per distinct prefix). Per tenant
//! namespace, with `d = xxh3-128(tokens as i64 LE)`:
//!
//! ```text
//!   'D' d hash        data:  [u32 LE meta_len][meta: PromptChunk without buffer][buffer]
//!   'M' d parent_hash meta:  PromptChunk without buffer   (the version reached from `parent_hash`)
//!   'H' d             meta of the first version written   (block 0 matches any version)
//! ```
//!
//! A `Read` location is the hex of the data key (50 hex digits).
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kvtier_core::Key;
use kvtier_proto::kvstore as pb;
use prost::Message;

/// The digest naming a block's tokens.
pub fn digest(tokens: &[i64]) -> [u8; 16] {
    let mut buf = Vec::with_capacity(tokens.len() * 8);
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_128(&buf).to_be_bytes()
}

fn key(tag: u8, d: &[u8; 16], h: Option<u64>) -> Key {
    let mut k = Vec::with_capacity(25);
    k.push(tag);
    k.extend_from_slice(d);
    if let Some(h) = h {
        k.extend_from_slice(&h.to_be_bytes());
    }
    Key::new(k).expect("non-empty, short")
}

/// The data record of version `hash` of the block with digest `d`.
pub fn data_key(d: &[u8; 16], hash: u64) -> Key {
    key(b'D', d, Some(hash))
}

/// The metadata of the version of `d` that follows the block `parent_hash`.
pub fn version_key(d: &[u8; 16], parent_hash: u64) -> Key {
    key(b'M', d, Some(parent_hash))
}

/// The metadata of the first version of `d` written (a prompt's block 0).
pub fn first_key(d: &[u8; 16]) -> Key {
    key(b'H', d, None)
}

/// The data record of `chunk` (its buffer after its metadata), and the
/// metadata alone (the payload of its `M` and `H` records).
pub fn encode(mut chunk: pb::PromptChunk) -> (Bytes, Bytes) {
    let buffer = std::mem::take(&mut chunk.buffer);
    let meta = Bytes::from(chunk.encode_to_vec());
    let mut data = BytesMut::with_capacity(4 + meta.len() + buffer.len());
    data.put_u32_le(meta.len() as u32);
    data.put_slice(&meta);
    data.put_slice(&buffer);
    (data.freeze(), meta)
}

/// The chunk stored in a data record, its buffer a zero-copy slice of `payload`.
pub fn decode_data(mut payload: Bytes) -> Result<pb::PromptChunk, String> {
    if payload.len() < 4 {
        return Err("stored chunk is truncated".into());
    }
    let mlen = payload.get_u32_le() as usize;
    if payload.len() < mlen {
        return Err("stored chunk is truncated".into());
    }
    let mut chunk = pb::PromptChunk::decode(payload.split_to(mlen))
        .map_err(|e| format!("stored chunk unreadable: {e}"))?;
    chunk.buffer = payload;
    Ok(chunk)
}

/// The `Read` location of a data key.
pub fn location(data_key: &Key) -> String {
    hex::encode(data_key.as_bytes())
}

/// The data key a `Read` location names, checked by length before decoding;
/// `None` for anything that is not a location `Lookup` returned.
pub fn parse_location(location: &str) -> Option<Key> {
    Some(location)
        .filter(|l| l.len() == 50)
        .and_then(unhex)
        .filter(|k| k.len() == 25 && k[0] == b'D')
        .map(|k| Key::new(k).expect("25 bytes"))
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    hex::decode(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_roundtrip() {
        assert_eq!(unhex(&hex::encode([0, 255, 16])), Some(vec![0, 255, 16]));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("é1"), None);
    }

    #[test]
    fn records_roundtrip_and_locations_name_data_keys() {
        let d = digest(&[1, 2, 3]);
        let chunk = pb::PromptChunk {
            hash: 7,
            parent_hash: 3,
            buffer: Bytes::from_static(b"payload"),
            tokens: vec![1, 2, 3],
            ..Default::default()
        };
        let (data, meta) = encode(chunk.clone());
        assert_eq!(decode_data(data).unwrap(), chunk);
        assert_eq!(
            pb::PromptChunk::decode(meta).unwrap().buffer,
            Bytes::new(),
            "metadata records carry no buffer"
        );
        let k = data_key(&d, 7);
        assert_eq!(parse_location(&location(&k)), Some(k));
        assert_eq!(
            parse_location(&location(&version_key(&d, 7))),
            None,
            "not a data key"
        );
        assert_eq!(parse_location(&"ab".repeat(1 << 19)), None);
        assert!(decode_data(Bytes::from_static(b"\x09\0\0\0ab")).is_err());
    }

    proptest::proptest! {
        #[test]
        fn locations_never_panic(s in "\\PC{0,120}", bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            let _ = parse_location(&s);
            proptest::prop_assert_eq!(unhex(&hex::encode(&bytes)), Some(bytes));
        }
    }
}
