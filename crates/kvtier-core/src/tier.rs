//! The storage-tier trait. The engine composes tiers top to bottom
//! (memory → disk → object store); each implements this trait.
use crate::block::{Block, BlockId};
use crate::error::Result;
use async_trait::async_trait;
use std::fmt;

/// Which tier a block was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TierKind {
    /// RAM, with a byte budget.
    Memory,
    /// Local disk; survives restarts.
    Disk,
    /// Object storage shared by every node.
    Object,
    /// Another node of the cluster (its memory or disk).
    Peer,
}

impl TierKind {
    /// Lower-case name used in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Memory => "memory",
            TierKind::Disk => "disk",
            TierKind::Object => "object",
            TierKind::Peer => "peer",
        }
    }
}

impl fmt::Display for TierKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counters a tier exposes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blocks currently held.
    pub blocks: u64,
    /// Payload bytes currently held.
    pub bytes: u64,
    /// Byte budget.
    pub capacity_bytes: u64,
    /// Reads that found the block here.
    pub hits: u64,
    /// Reads that did not.
    pub misses: u64,
    /// Blocks removed to make room.
    pub evictions: u64,
    /// Blocks removed because their TTL passed.
    pub expirations: u64,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The block was new and is now stored.
    Stored,
    /// An identical block was already stored.
    Existing,
}

/// One storage tier. Implementations must be safe to call concurrently.
///
/// Contract: `get` returns only blocks whose checksum is intact and which have
/// not expired; a tier that can corrupt data verifies before returning.
#[async_trait]
pub trait Tier: Send + Sync + 'static {
    /// Which tier this is.
    fn kind(&self) -> TierKind;
    /// Fetches a block.
    async fn get(&self, id: &BlockId) -> Result<Option<Block>>;
    /// True when the block is present (cheaper than `get`).
    async fn contains(&self, id: &BlockId) -> Result<bool>;
    /// Stores a block. Storing an identical block again is a no-op.
    async fn put(&self, block: Block) -> Result<PutOutcome>;
    /// Removes a block and, to keep chains prefix-closed, its descendants.
    /// Returns how many blocks were removed.
    async fn delete(&self, id: &BlockId) -> Result<u64>;
    /// Counters.
    fn stats(&self) -> TierStats;
    /// Tier-specific counters beyond [`TierStats`], as `(name, help, value)`;
    /// exported as `kvtier_<name>_total` (the object-store tier's requests,
    /// cache hits, corrupt objects). None by default.
    fn extra_counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        Vec::new()
    }
}

/// How a put treats an existing block under the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Blocks are immutable: an identical re-write is a no-op, a different
    /// payload under the same key is rejected.
    Never,
    /// Key/value semantics: replace the old value (and drop its descendants).
    Replace,
}
