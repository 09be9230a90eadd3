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
//! * [`shares`]: capacity shares, which tenant gives up a block when a local
//!   tier is full (max-min fair over resident bytes).
//! * [`lease`]: leases on looked-up prefixes and the byte budget their pins
//!   are charged to.
//! * [`engine`]: composes tiers into one store: lookup, read, write, delete,
//!   leases, and in a cluster the paths through the other nodes.
//! * [`object_link`]: how the engine uses an object-store tier (write policies,
//!   write-back queue, parallel lookups); the tier itself is in `kvtier-object`.
//! * [`cluster`]: cluster mode's placement (rendezvous ranking of nodes per
//!   block) and the [`cluster::Peers`] seam through which the engine reaches
//!   the other nodes; the server implements it over gRPC (docs/cluster.md).
//! * [`deadline`]: the request deadline, visible to tiers that call remote services.
//! * [`error`]: the one error type, with a kind fronts map to status codes.
//! * [`size`]: byte sizes with units, for configuration (`2GiB`, `1.2MB`).
//!
//! The core knows storage, not protocols: the fronts in `kvtier-server`
//! (gRPC, data plane, HTTP, same-host socket) translate their requests into
//! calls on [`engine::Engine`].

pub mod admission;
pub mod block;
mod chain_index;
pub mod clock;
pub mod cluster;
pub mod deadline;
pub mod disk;
pub mod engine;
pub mod error;
pub mod events;
pub mod keys;
pub mod lease;
pub mod memory;
pub mod object_link;
pub mod shares;
pub mod size;
pub mod tier;

pub use admission::{Admission, AdmissionStats};
pub use block::{Block, BlockId, BlockMeta};
pub use disk::{DiskConfig, DiskTier, RecoveryReport, SyncMode};
pub use engine::{
    Engine, EngineBuilder, EngineConfig, LookupOutcome, StorageTiming, WriteOutcome, WritePolicy,
};
pub use error::{Error, Result};
pub use keys::{HashFn, Key, Namespace};
pub use object_link::{ObjectOptions, ObjectStats, ObjectWritePolicy};
pub use shares::{ShareClass, ShareStat, Shares};
pub use size::ByteSize;
pub use tier::{Tier, TierKind, TierStats};
