//! The on-disk record format, version 1 (specified in `docs/disk-format.md`).
//!
//! One record per file: a self-describing, checksummed header followed by the
//! payload. All integers are little-endian.
//!
//! Version 2 is the same header whose payload is a codec frame (a compressed
//! block). Only the object-store tier writes it and only it reads it
//! ([`decode_object_header`]); the disk tier's [`decode_header`] refuses it,
//! so a compressed record can never be served raw. See
//! `docs/disk-format.md#version-2-compressed-objects`.
//!
//! ```text
//! off  len  field
//!   0    4  magic "KVTB"
//!   4    2  format version (1)
//!   6    2  flags (bit 0: has parent, bit 1: has expiry, bit 2: has token
//!             ids; others must be 0)
//!   8    4  header length H in bytes, including the trailing header crc
//!  12    8  sequence number (unique per write, higher = newer)
//!  20    8  payload length P
//!  28    4  crc32c of the payload
//!  32    4  token count
//!  36    8  expiry, unix ms (0 when bit 1 of flags is clear)
//!  44    2  namespace length N
//!  46    2  key length K
//!  48    2  parent key length Q (0 when bit 0 of flags is clear)
//!  50    2  reserved, 0
//!  52    N  namespace (UTF-8)
//!   .    K  key
//!   .    Q  parent key
//!   .   4T  token ids, u32 each (T = token count when bit 2 is set, else 0)
//! H-4    4  crc32c of header bytes [0, H-4)
//!   H    P  payload
//! ```
use crate::block::{BlockId, BlockMeta};
use crate::keys::{Key, MAX_KEY_LEN, MAX_NAMESPACE_LEN, Namespace};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// First four bytes of every record.
pub const MAGIC: [u8; 4] = *b"KVTB";
/// Record format version written by this build.
pub const VERSION: u16 = 1;
/// Record version whose payload is a codec frame (object-store tier only):
/// the header's payload length is the stored (framed) length and its CRC32C
/// is that of the decoded payload.
pub const VERSION_CODEC: u16 = 2;
/// Bytes before the variable-length fields.
pub const FIXED_LEN: usize = 52;
/// Longest header without token ids (fixed part, longest names, header crc):
/// what a reader reads first.
pub const MAX_NAMES_HEADER_LEN: usize = FIXED_LEN + MAX_NAMESPACE_LEN + 2 * MAX_KEY_LEN + 4;
/// Most token ids a record keeps; a block with more is written without them
/// (docs/events.md: its KV event after a restart then names no tokens).
pub const MAX_TOKEN_IDS: u32 = 1 << 16;
/// Longest possible header.
pub const MAX_HEADER_LEN: usize = MAX_NAMES_HEADER_LEN + 4 * MAX_TOKEN_IDS as usize;
/// Extension of a committed record file.
pub const RECORD_EXT: &str = "kvb";
/// Extension of a record still being written (deleted on open).
pub const TEMP_EXT: &str = "tmp";

const FLAG_PARENT: u16 = 1;
const FLAG_EXPIRY: u16 = 2;
const FLAG_TOKENS: u16 = 4;

/// A decoded record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// Write sequence number; the highest wins when one id has several files.
    pub seq: u64,
    /// Block metadata (id, parent, token count, payload crc, expiry).
    pub meta: BlockMeta,
    /// Payload length in bytes.
    pub payload_len: u64,
    /// Header length in bytes (the payload starts here).
    pub header_len: usize,
    /// Record format version: [`VERSION`], or [`VERSION_CODEC`] (only from
    /// [`decode_object_header`]).
    pub version: u16,
    /// The block's token ids, when its writer gave them (disk records only:
    /// the object tier writes none, so a node of an older build can read
    /// every object).
    pub tokens: Option<Arc<[u32]>>,
}

/// Why a header could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer bytes than the header needs: a torn write.
    Short,
    /// The bytes are not a valid v1 header (bad magic, version, crc, field).
    Corrupt(String),
}

/// The 16-byte name of a block's files: a truncated SHA-256 over the length-
/// prefixed namespace and key (collision-resistant, so ids cannot alias).
pub fn file_hash(id: &BlockId) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update((id.namespace.as_str().len() as u16).to_le_bytes());
    h.update(id.namespace.as_str().as_bytes());
    h.update(id.key.as_bytes());
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Encodes the header for `meta` with the given sequence number and payload length.
pub fn encode_header(meta: &BlockMeta, seq: u64, payload_len: u64) -> Vec<u8> {
    encode(meta, None, seq, payload_len, VERSION)
}

/// [`encode_header`] keeping the block's token ids, when there are exactly
/// `meta.token_count` of them and at most [`MAX_TOKEN_IDS`] (the disk tier's
/// records, so its KV events name them after a restart).
pub fn encode_header_tokens(
    meta: &BlockMeta,
    tokens: Option<&[u32]>,
    seq: u64,
    payload_len: u64,
) -> Vec<u8> {
    let tokens = tokens.filter(|t| {
        !t.is_empty() && t.len() == meta.token_count as usize && meta.token_count <= MAX_TOKEN_IDS
    });
    encode(meta, tokens, seq, payload_len, VERSION)
}

/// [`encode_header`] with an explicit record version ([`VERSION_CODEC`] for
/// an object whose payload is a codec frame of `payload_len` bytes).
pub fn encode_header_version(
    meta: &BlockMeta,
    seq: u64,
    payload_len: u64,
    version: u16,
) -> Vec<u8> {
    encode(meta, None, seq, payload_len, version)
}

fn encode(
    meta: &BlockMeta,
    tokens: Option<&[u32]>,
    seq: u64,
    payload_len: u64,
    version: u16,
) -> Vec<u8> {
    let ns = meta.id.namespace.as_str().as_bytes();
    let key = meta.id.key.as_bytes();
    let parent = meta.parent.as_ref().map(Key::as_bytes).unwrap_or(&[]);
    let toks = tokens.unwrap_or(&[]);
    let header_len = FIXED_LEN + ns.len() + key.len() + parent.len() + 4 * toks.len() + 4;
    let mut flags = 0u16;
    if meta.parent.is_some() {
        flags |= FLAG_PARENT;
    }
    if meta.expires_unix_ms.is_some() {
        flags |= FLAG_EXPIRY;
    }
    if tokens.is_some() {
        flags |= FLAG_TOKENS;
    }
    let mut b = Vec::with_capacity(header_len);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&(header_len as u32).to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&payload_len.to_le_bytes());
    b.extend_from_slice(&meta.crc32c.to_le_bytes());
    b.extend_from_slice(&meta.token_count.to_le_bytes());
    b.extend_from_slice(&meta.expires_unix_ms.unwrap_or(0).to_le_bytes());
    b.extend_from_slice(&(ns.len() as u16).to_le_bytes());
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&(parent.len() as u16).to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    debug_assert_eq!(b.len(), FIXED_LEN);
    b.extend_from_slice(ns);
    b.extend_from_slice(key);
    b.extend_from_slice(parent);
    for t in toks {
        b.extend_from_slice(&t.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(b.len(), header_len);
    b
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Decodes and verifies the header at the start of `buf` (which may hold more).
/// Version 1 only: the disk tier's reader.
pub fn decode_header(buf: &[u8]) -> Result<RecordHeader, HeaderError> {
    decode_header_versions(buf, &[VERSION])
}

/// [`decode_header`] for objects in the object store: version 1 (raw
/// payload) or [`VERSION_CODEC`] (payload is a codec frame).
pub fn decode_object_header(buf: &[u8]) -> Result<RecordHeader, HeaderError> {
    decode_header_versions(buf, &[VERSION, VERSION_CODEC])
}

fn decode_header_versions(buf: &[u8], versions: &[u16]) -> Result<RecordHeader, HeaderError> {
    let bad = |m: String| Err(HeaderError::Corrupt(m));
    if buf.len() < FIXED_LEN {
        // A prefix of a valid magic is a torn write; anything else is garbage.
        return if MAGIC.starts_with(&buf[..buf.len().min(4)]) {
            Err(HeaderError::Short)
        } else {
            bad("bad magic".into())
        };
    }
    if buf[..4] != MAGIC {
        return bad(format!("bad magic {:02x?}", &buf[..4]));
    }
    let version = u16_at(buf, 4);
    if !versions.contains(&version) {
        return bad(format!("unsupported record version {version}"));
    }
    let flags = u16_at(buf, 6);
    let header_len = u32_at(buf, 8) as usize;
    if !(FIXED_LEN + 4..=MAX_HEADER_LEN).contains(&header_len) {
        return bad(format!("header length {header_len} out of range"));
    }
    if buf.len() < header_len {
        return Err(HeaderError::Short);
    }
    let want = u32_at(buf, header_len - 4);
    let got = crc32c::crc32c(&buf[..header_len - 4]);
    if want != got {
        return bad(format!(
            "header crc32c mismatch (stored {want:#010x}, computed {got:#010x})"
        ));
    }
    if flags & !(FLAG_PARENT | FLAG_EXPIRY | FLAG_TOKENS) != 0 {
        return bad(format!("unknown flags {flags:#06x}"));
    }
    let (n, k, q) = (
        u16_at(buf, 44) as usize,
        u16_at(buf, 46) as usize,
        u16_at(buf, 48) as usize,
    );
    let token_count = u32_at(buf, 32);
    let t = if flags & FLAG_TOKENS != 0 {
        if token_count == 0 || token_count > MAX_TOKEN_IDS {
            return bad(format!("{token_count} token ids flagged"));
        }
        token_count as usize
    } else {
        0
    };
    if FIXED_LEN + n + k + q + 4 * t + 4 != header_len || (q == 0) == (flags & FLAG_PARENT != 0) {
        return bad("field lengths disagree with the header length or flags".into());
    }
    let ns = std::str::from_utf8(&buf[FIXED_LEN..FIXED_LEN + n])
        .map_err(|_| HeaderError::Corrupt("namespace is not UTF-8".into()))
        .and_then(|s| Namespace::new(s).map_err(|e| HeaderError::Corrupt(e.message)))?;
    let key_at = FIXED_LEN + n;
    let key = Key::new(Bytes::copy_from_slice(&buf[key_at..key_at + k]))
        .map_err(|e| HeaderError::Corrupt(e.message))?;
    let parent = if q == 0 {
        None
    } else {
        let p = &buf[key_at + k..key_at + k + q];
        Some(Key::new(Bytes::copy_from_slice(p)).map_err(|e| HeaderError::Corrupt(e.message))?)
    };
    let expires_unix_ms = (flags & FLAG_EXPIRY != 0).then(|| u64_at(buf, 36));
    let toks_at = key_at + k + q;
    let tokens = (t > 0).then(|| {
        (0..t)
            .map(|i| u32_at(buf, toks_at + 4 * i))
            .collect::<Arc<[u32]>>()
    });
    Ok(RecordHeader {
        seq: u64_at(buf, 12),
        meta: BlockMeta {
            id: BlockId::new(ns, key),
            parent,
            token_count,
            crc32c: u32_at(buf, 28),
            expires_unix_ms,
        },
        payload_len: u64_at(buf, 20),
        header_len,
        version,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(parent: bool, exp: Option<u64>) -> BlockMeta {
        BlockMeta {
            id: BlockId::new(
                Namespace::new("ns/a").unwrap(),
                Key::new(&b"key-1"[..]).unwrap(),
            ),
            parent: parent.then(|| Key::new(&b"parent"[..]).unwrap()),
            token_count: 128,
            crc32c: 0xdead_beef,
            expires_unix_ms: exp,
        }
    }

    #[test]
    fn header_roundtrip_and_damage() {
        for (p, e) in [(false, None), (true, Some(1234)), (true, None)] {
            let m = meta(p, e);
            let h = encode_header(&m, 42, 1000);
            let d = decode_header(&h).unwrap();
            assert_eq!(
                (d.meta, d.seq, d.payload_len, d.header_len),
                (m.clone(), 42, 1000, h.len())
            );
            for cut in [0, 3, 10, FIXED_LEN, h.len() - 1] {
                assert_eq!(
                    decode_header(&h[..cut]),
                    Err(HeaderError::Short),
                    "cut {cut}"
                );
            }
            // Version 2 is for the object tier only: the disk reader refuses it.
            let v2 = encode_header_version(&m, 42, 1000, VERSION_CODEC);
            assert!(decode_header(&v2).is_err());
            assert_eq!(decode_object_header(&v2).unwrap().version, VERSION_CODEC);
            assert_eq!(decode_object_header(&h).unwrap().version, VERSION);
            for i in 0..h.len() {
                let mut x = h.clone();
                x[i] ^= 0x10;
                assert!(decode_header(&x).is_err(), "flip at {i} accepted");
            }
        }
    }

    #[test]
    fn token_ids_roundtrip_only_when_they_match_the_token_count() {
        let m = meta(true, Some(7));
        let toks: Vec<u32> = (0..128).map(|i| i * 1000 + 7).collect();
        let h = encode_header_tokens(&m, Some(&toks), 9, 100);
        assert_eq!(h.len(), encode_header(&m, 9, 100).len() + 4 * 128);
        let d = decode_header(&h).unwrap();
        assert_eq!(d.tokens.as_deref(), Some(&toks[..]));
        assert_eq!((d.meta, d.header_len), (m.clone(), h.len()));
        assert_eq!(
            decode_object_header(&h).unwrap().tokens.as_deref(),
            Some(&toks[..])
        );
        // Any other count is dropped rather than stored wrong.
        for wrong in [&toks[..127], &[][..]] {
            let d = decode_header(&encode_header_tokens(&m, Some(wrong), 9, 100)).unwrap();
            assert_eq!(d.tokens, None);
        }
        assert_eq!(
            decode_header(&encode_header(&m, 9, 100)).unwrap().tokens,
            None
        );
        let cut = &h[..h.len() - 1];
        assert_eq!(decode_header(cut), Err(HeaderError::Short));
        for i in 0..h.len() {
            let mut x = h.clone();
            x[i] ^= 0x01;
            assert!(decode_header(&x).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn a_token_flag_without_a_plausible_count_is_corrupt() {
        let mut m = meta(false, None);
        m.token_count = 0;
        let mut h = encode_header(&m, 1, 1);
        h[6] |= FLAG_TOKENS as u8;
        let n = h.len();
        let crc = crc32c::crc32c(&h[..n - 4]);
        h[n - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(
            matches!(decode_header(&h), Err(HeaderError::Corrupt(w)) if w.contains("token ids"))
        );
    }
}
