//! Namespaces, keys and the chained block hash.
//!
//! A block's key is `h[i] = H(h[i-1], tokens of block i)` with `h[-1]` all zeros,
//! so equal keys mean equal prefixes. The exact byte layout (see `docs/keys.md`
//! and `tests/vectors/keys.json`) is part of the API: every client implementation
//! must reproduce it.
//!
//! * `xxh3-64-v1` (default): `xxh3_64(prev_8_bytes_LE || tokens as u32 LE)`, key =
//!   the 8 bytes of the result, big-endian.
//! * `sha256-v1`: `sha256(prev_32_bytes || tokens as u32 LE)`, key = the 32-byte digest.
//!
//! A **salted** chain starts from `h[-1] = sha256("kvtier-salt-v1\0" || salt)`
//! cut to the key length instead of zeros ([`HashFn::seed`]): a tenant that
//! keeps its salt secret has keys nobody else can compute from the tokens, so
//! nobody else can pre-write them (docs/security.md). The salt never leaves
//! the client; an empty salt is the unsalted chain.
use crate::error::{Error, Result};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::{fmt, str::FromStr, sync::Arc};

/// Longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;
/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// Default tokens per block (the seed service's block size).
pub const DEFAULT_BLOCK_SIZE: usize = 128;
/// Largest block size accepted.
pub const MAX_BLOCK_SIZE: usize = 1 << 16;

/// Isolates blocks that must never mix: tenant, model, KV layout.
///
/// 1–128 bytes of `[A-Za-z0-9._:/-]`. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(Arc<str>);

impl Namespace {
    /// Validates and wraps a namespace name.
    pub fn new(name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::invalid("namespace must not be empty"));
        }
        if name.len() > MAX_NAMESPACE_LEN {
            return Err(Error::invalid(format!(
                "namespace is {} bytes; the limit is {MAX_NAMESPACE_LEN}",
                name.len()
            )));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
        {
            return Err(Error::invalid(format!(
                "namespace {name:?} contains {c:?}; allowed are A-Z a-z 0-9 . _ : / -"
            )));
        }
        Ok(Self(name.into()))
    }
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}
impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A block key: 1–512 opaque bytes (8 for `xxh3-64-v1`, 32 for `sha256-v1`,
/// the UTF-8 name for HTTP key/value entries). Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Bytes);

impl Key {
    /// Validates and wraps key bytes.
    pub fn new(bytes: impl Into<Bytes>) -> Result<Self> {
        let b = bytes.into();
        if b.is_empty() {
            return Err(Error::invalid("key must not be empty"));
        }
        if b.len() > MAX_KEY_LEN {
            return Err(Error::invalid(format!(
                "key is {} bytes; the limit is {MAX_KEY_LEN}",
                b.len()
            )));
        }
        Ok(Self(b))
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// The key bytes, shared.
    pub fn bytes(&self) -> Bytes {
        self.0.clone()
    }
    /// Lower-case hex of the key.
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }
    /// Parses lower- or upper-case hex.
    pub fn from_hex(s: &str) -> Result<Self> {
        let b = hex::decode(s).map_err(|e| Error::invalid(format!("key {s:?} is not hex: {e}")))?;
        Self::new(b)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(s) if s.chars().all(|c| c.is_ascii_graphic()) && self.0.len() != 8 => {
                write!(f, "{s:?}")
            }
            _ => write!(f, "0x{}", self.to_hex()),
        }
    }
}

/// A named, versioned chain-hash function. The name is part of the wire API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HashFn {
    /// `xxh3-64-v1`: fast, 8-byte keys. The default.
    #[default]
    Xxh3_64V1,
    /// `sha256-v1`: 32-byte keys, for callers that want a cryptographic hash.
    Sha256V1,
}

impl HashFn {
    /// Every supported function.
    pub const ALL: [HashFn; 2] = [HashFn::Xxh3_64V1, HashFn::Sha256V1];

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            HashFn::Xxh3_64V1 => "xxh3-64-v1",
            HashFn::Sha256V1 => "sha256-v1",
        }
    }
    /// Key length produced, in bytes.
    pub fn key_len(self) -> usize {
        match self {
            HashFn::Xxh3_64V1 => 8,
            HashFn::Sha256V1 => 32,
        }
    }
    /// Parses a wire name; empty selects the default.
    pub fn parse(name: &str) -> Result<Self> {
        if name.is_empty() {
            return Ok(Self::default());
        }
        name.parse()
    }

    /// Hashes one block given the previous key (`None` for the first block).
    pub fn block_key(self, prev: Option<&Key>, tokens: &[u32]) -> Key {
        let mut buf = Vec::with_capacity(32 + tokens.len() * 4);
        match prev {
            Some(p) => buf.extend_from_slice(p.as_bytes()),
            None => buf.resize(self.key_len(), 0),
        }
        for t in tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        match self {
            HashFn::Xxh3_64V1 => {
                let h = xxhash_rust::xxh3::xxh3_64(&buf);
                Key(Bytes::copy_from_slice(&h.to_be_bytes()))
            }
            HashFn::Sha256V1 => Key(Bytes::copy_from_slice(&Sha256::digest(&buf))),
        }
    }

    /// Keys of every *full* block of `tokens`; trailing tokens that do not fill a
    /// block are ignored (they cannot be cached until the block is complete).
    pub fn chain(self, tokens: &[u32], block_size: usize) -> Result<Vec<Key>> {
        self.chain_salted(tokens, block_size, &[])
    }

    /// The value a chain salted with `salt` starts from (`h[-1]`); `None`
    /// for the empty salt (all zeros, the unsalted chain).
    pub fn seed(self, salt: &[u8]) -> Option<Key> {
        if salt.is_empty() {
            return None;
        }
        let mut h = Sha256::new();
        h.update(b"kvtier-salt-v1\0");
        h.update(salt);
        let d = h.finalize();
        Some(Key(Bytes::copy_from_slice(&d[..self.key_len()])))
    }

    /// [`HashFn::chain`] starting from [`HashFn::seed`]`(salt)`.
    pub fn chain_salted(self, tokens: &[u32], block_size: usize, salt: &[u8]) -> Result<Vec<Key>> {
        check_block_size(block_size)?;
        let seed = self.seed(salt);
        let mut keys: Vec<Key> = Vec::with_capacity(tokens.len() / block_size);
        for chunk in tokens.chunks_exact(block_size) {
            let k = self.block_key(keys.last().or(seed.as_ref()), chunk);
            keys.push(k);
        }
        Ok(keys)
    }
}

/// Rejects block sizes of 0 or above [`MAX_BLOCK_SIZE`].
pub fn check_block_size(block_size: usize) -> Result<()> {
    if block_size == 0 || block_size > MAX_BLOCK_SIZE {
        return Err(Error::invalid(format!(
            "block size {block_size} out of range 1..={MAX_BLOCK_SIZE}"
        )));
    }
    Ok(())
}

impl FromStr for HashFn {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        HashFn::ALL
            .into_iter()
            .find(|h| h.name() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown hash function {s:?}; supported: xxh3-64-v1, sha256-v1"
                ))
            })
    }
}

impl fmt::Display for HashFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_validation() {
        assert!(Namespace::new("tenant-a/model.v1:bf16").is_ok());
        assert_eq!(
            Namespace::new("").unwrap_err().kind,
            crate::error::ErrorKind::InvalidArgument
        );
        assert!(
            Namespace::new(&"a".repeat(129))
                .unwrap_err()
                .message
                .contains("128")
        );
        assert!(Namespace::new("has space").is_err());
    }

    #[test]
    fn key_validation() {
        assert!(Key::new(Bytes::new()).is_err());
        assert!(
            Key::new(vec![0u8; 513])
                .unwrap_err()
                .message
                .contains("512")
        );
        assert!(Key::new(vec![1u8; 512]).is_ok());
    }

    #[test]
    fn chain_ignores_partial_block_and_depends_on_prefix() {
        let toks: Vec<u32> = (0..300).collect();
        let keys = HashFn::Xxh3_64V1.chain(&toks, 128).unwrap();
        assert_eq!(keys.len(), 2);
        // Same second block after a different first block -> different key.
        let mut other = toks.clone();
        other[0] = 999;
        let k2 = HashFn::Xxh3_64V1.chain(&other, 128).unwrap();
        assert_ne!(keys[1], k2[1]);
        assert_eq!(
            HashFn::Sha256V1.chain(&toks, 128).unwrap()[0]
                .as_bytes()
                .len(),
            32
        );
        assert!(HashFn::Xxh3_64V1.chain(&toks, 0).is_err());
    }

    #[test]
    fn shared_test_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/keys.json");
        let text = std::fs::read_to_string(path).expect("tests/vectors/keys.json");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = v["cases"].as_array().unwrap();
        assert!(cases.len() >= 6);
        assert!(cases.iter().any(|c| c["salt"].as_str() != Some("")));
        for case in cases {
            let hash: HashFn = case["hash"].as_str().unwrap().parse().unwrap();
            let bs = case["block_size"].as_u64().unwrap() as usize;
            let tokens: Vec<u32> = case["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            let salt = case["salt"].as_str().unwrap_or("");
            let got: Vec<String> = hash
                .chain_salted(&tokens, bs, salt.as_bytes())
                .unwrap()
                .iter()
                .map(Key::to_hex)
                .collect();
            let want: Vec<String> = case["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap().to_string())
                .collect();
            assert_eq!(got, want, "case {}", case["name"]);
        }
    }
}
