//! kvtier-core: the storage half of kvtier.
//!
//! * [`keys`]: namespaces, block keys and the chained block hash.
//! * [`block`]: immutable blocks (payload + metadata, CRC32C-checked).
//! * [`tier`]: the trait every storage tier implements.
//! * [`memory`]: the memory tier (byte budget, prefix-closed eviction, TTLs, pins).
//! * [`disk`]: the local disk tier (crash-safe records, checksums, restart recovery).
//! * [`engine`]: composes tiers into one store: lookup, read, write, delete, leases.
//!
//! The core knows storage, not protocols: the gRPC and HTTP fronts in
//! `kvtier-server` translate their requests into calls on [`engine::Engine`].

pub mod block;
pub mod disk;
pub mod engine;
pub mod error;
pub mod keys;
pub mod lease;
pub mod memory;
pub mod size;
pub mod tier;

pub use block::{Block, BlockId, BlockMeta};
pub use disk::{DiskConfig, DiskTier, RecoveryReport, SyncMode};
pub use engine::{Engine, EngineConfig, LookupOutcome, StorageTiming, WriteOutcome, WritePolicy};
pub use error::{Error, Result};
pub use keys::{HashFn, Key, Namespace};
pub use size::ByteSize;
pub use tier::{Tier, TierKind, TierStats};
