//! kvtier-core: the storage half of kvtier.
//!
//! * [`keys`]: namespaces, block keys and the chained block hash.
//! * [`block`]: immutable blocks (payload + metadata, CRC32C-checked).
//! * [`clock`]: the wall clock expiry times are stamped with (Unix ms).
//! * [`tier`]: the trait every storage tier implements.
//! * [`memory`]: the memory tier (byte budget, prefix-closed eviction, TTLs, pins).
//! * `chain_index`: the prefix-closed index (chain links, leaf LRU, expiry,
//!   pins) both local tiers keep.
//! * [`disk`]: the local disk tier (crash-safe records, checksums, restart recovery).
//! * [`engine`]: composes tiers into one store: lookup, read, write, delete, leases.
//! * [`object_link`]: how the engine uses an object-store tier (write policies,
//!   write-back queue, parallel lookups); the tier itself is in `kvtier-object`.
//! * [`deadline`]: the request deadline, visible to tiers that call remote services.
//!
//! The core knows storage, not protocols: the gRPC and HTTP fronts in
//! `kvtier-server` translate their requests into calls on [`engine::Engine`].

pub mod block;
mod chain_index;
pub mod clock;
pub mod cluster;
pub mod deadline;
pub mod disk;
pub mod engine;
pub mod error;
pub mod keys;
pub mod lease;
pub mod memory;
pub mod object_link;
pub mod size;
pub mod tier;

pub use block::{Block, BlockId, BlockMeta};
pub use disk::{DiskConfig, DiskTier, RecoveryReport, SyncMode};
pub use engine::{
    Engine, EngineBuilder, EngineConfig, LookupOutcome, StorageTiming, WriteOutcome, WritePolicy,
};
pub use error::{Error, Result};
pub use keys::{HashFn, Key, Namespace};
pub use object_link::{ObjectOptions, ObjectStats, ObjectWritePolicy};
pub use size::ByteSize;
pub use tier::{Tier, TierKind, TierStats};
