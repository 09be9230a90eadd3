//! Immutable blocks: a payload plus the metadata needed to serve, verify and
//! evict it. A block never changes after it is stored; re-writing the same key
//! with the same payload is a no-op, with a different payload it is rejected.
use crate::error::{Error, Result};
use crate::keys::{Key, Namespace};
use bytes::Bytes;

/// Where a block lives: its namespace and key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId {
    /// Isolation domain.
    pub namespace: Namespace,
    /// Key within the namespace.
    pub key: Key,
}

impl BlockId {
    /// Builds an id.
    pub fn new(namespace: Namespace, key: Key) -> Self {
        Self { namespace, key }
    }
}

/// Everything about a block except its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    /// Namespace and key.
    pub id: BlockId,
    /// Key of the previous block in the chain; `None` for a chain head or a plain
    /// key/value entry. Eviction never removes a parent before its children.
    pub parent: Option<Key>,
    /// Tokens covered by this block (0 for key/value entries).
    pub token_count: u32,
    /// CRC32C of the payload, verified on write and on every read from a tier
    /// that can corrupt data (disk, object store).
    pub crc32c: u32,
    /// Absolute expiry in Unix milliseconds; `None` = never.
    pub expires_unix_ms: Option<u64>,
}

impl BlockMeta {
    /// Expires `ttl_ms` from now (0: never), on the wall clock every tier and
    /// node shares.
    pub fn expire_after_ms(&mut self, ttl_ms: u64) {
        self.expires_unix_ms = (ttl_ms > 0).then(|| crate::clock::unix_ms().saturating_add(ttl_ms));
    }
}

/// An immutable block. Cloning shares the payload (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Metadata.
    pub meta: BlockMeta,
    /// The bytes (KV tensors for a cache block, the value for a key/value entry).
    pub payload: Bytes,
    /// The token ids its writer gave, passed on to the other nodes of a
    /// cluster so their KV events can name them (docs/events.md). Kept in
    /// the disk tier's records (docs/disk-format.md), never in the object
    /// store's: a block read from there has none.
    pub tokens: Option<std::sync::Arc<[u32]>>,
}

impl Block {
    /// Builds a block, computing the checksum from the payload.
    pub fn new(id: BlockId, parent: Option<Key>, token_count: u32, payload: Bytes) -> Self {
        let crc32c = crc32c::crc32c(&payload);
        Self {
            meta: BlockMeta {
                id,
                parent,
                token_count,
                crc32c,
                expires_unix_ms: None,
            },
            payload,
            tokens: None,
        }
    }

    /// Builds a block from a client-supplied checksum, verifying it first.
    pub fn with_checksum(
        id: BlockId,
        parent: Option<Key>,
        token_count: u32,
        crc: u32,
        payload: Bytes,
    ) -> Result<Self> {
        let actual = crc32c::crc32c(&payload);
        Self::with_computed_checksum(id, parent, token_count, crc, actual, payload)
    }

    /// [`Block::with_checksum`] where the caller already computed the
    /// payload's CRC32C (`actual`, e.g. while receiving it); fails with
    /// `DataLoss` unless it equals the client-supplied `crc`.
    pub fn with_computed_checksum(
        id: BlockId,
        parent: Option<Key>,
        token_count: u32,
        crc: u32,
        actual: u32,
        payload: Bytes,
    ) -> Result<Self> {
        if actual != crc {
            return Err(Error::data_loss(format!(
                "checksum mismatch for key {:?}: client sent crc32c {crc:#010x}, payload has {actual:#010x}; nothing stored",
                id.key
            )));
        }
        Ok(Self {
            meta: BlockMeta {
                id,
                parent,
                token_count,
                crc32c: crc,
                expires_unix_ms: None,
            },
            payload,
            tokens: None,
        })
    }

    /// Recomputes the payload checksum and compares it with the metadata.
    pub fn verify(&self) -> Result<()> {
        let actual = crc32c::crc32c(&self.payload);
        if actual != self.meta.crc32c {
            return Err(Error::data_loss(format!(
                "stored block {:?} failed its checksum (want {:#010x}, got {actual:#010x})",
                self.meta.id.key, self.meta.crc32c
            )));
        }
        Ok(())
    }

    /// Payload length in bytes.
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }

    /// True when the block has expired at `now_unix_ms`.
    pub fn expired_at(&self, now_unix_ms: u64) -> bool {
        self.meta.expires_unix_ms.is_some_and(|e| e <= now_unix_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn checksum_is_verified() {
        let id = BlockId::new(Namespace::new("n").unwrap(), Key::new(&b"k"[..]).unwrap());
        let payload = Bytes::from_static(b"hello");
        let good = crc32c::crc32c(b"hello");
        assert!(Block::with_checksum(id.clone(), None, 0, good, payload.clone()).is_ok());
        let e = Block::with_checksum(id.clone(), None, 0, good ^ 1, payload).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::DataLoss);
        let mut b = Block::new(id, None, 0, Bytes::from_static(b"x"));
        b.payload = Bytes::from_static(b"y");
        assert!(b.verify().is_err());
    }
}
