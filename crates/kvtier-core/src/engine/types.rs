//! The engine's settings, its results (lookups, per-tier timing, stats) and
//! the disk write policy: the vocabulary callers of [`super::Engine`] use.

use crate::keys::DEFAULT_BLOCK_SIZE;
use crate::lease::LeaseGrant;
use crate::object_link::ObjectStats;
use crate::size::ByteSize;
use crate::tier::{PutOutcome, TierKind, TierStats};
use std::time::Duration;

/// Engine settings (the `[engine]` section of the server config).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Memory-tier byte budget.
    pub memory_capacity: ByteSize,
    /// Largest payload accepted for one block or value.
    pub max_block_size: ByteSize,
    /// Tokens per block when a request does not say.
    pub default_block_size: usize,
    /// Longest lease granted; longer requests are clamped.
    pub max_lease: Duration,
    /// Bytes all leases together may pin (a pinned block and the ancestors it
    /// keeps); 0 = half the memory tier, so pins can never leave writers
    /// without room.
    pub max_pinned: ByteSize,
    /// Bytes the leases of one namespace may pin; 0 = `max_pinned`.
    pub max_pinned_per_namespace: ByteSize,
    /// How the memory tier is divided between tenants (the disk tier's is
    /// [`crate::disk::DiskConfig::shares`]).
    pub shares: crate::shares::Shares,
}

impl EngineConfig {
    /// The pin caps, with 0s resolved to their defaults.
    pub fn pin_budget(&self) -> crate::lease::PinBudget {
        let total = match self.max_pinned.bytes() {
            0 => self.memory_capacity.bytes() / 2,
            n => n,
        };
        let per_namespace = match self.max_pinned_per_namespace.bytes() {
            0 => total,
            n => n.min(total),
        };
        crate::lease::PinBudget {
            total,
            per_namespace,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            memory_capacity: ByteSize::gib(2),
            max_block_size: ByteSize::mib(64),
            default_block_size: DEFAULT_BLOCK_SIZE,
            max_lease: Duration::from_secs(60),
            max_pinned: ByteSize(0),
            max_pinned_per_namespace: ByteSize(0),
            shares: Default::default(),
        }
    }
}

/// Time spent inside each tier during one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageTiming {
    /// Inside the memory tier.
    pub memory: Duration,
    /// Inside the disk tier.
    pub disk: Duration,
    /// Inside the object-store tier.
    pub object: Duration,
    /// Waiting on other nodes of the cluster.
    pub peer: Duration,
    /// Not a time: blocks this request's writes kept in memory only because
    /// an admission policy defers their disk or object-store copy until they
    /// are used again (docs/cache-choice.md). Carried here because every
    /// write step already takes this record; the fronts report it as the
    /// write's `deferred`.
    pub deferred: u32,
}

impl StorageTiming {
    /// Adds every tier's time of `o`.
    pub fn merge(&mut self, o: &StorageTiming) {
        self.memory += o.memory;
        self.disk += o.disk;
        self.object += o.object;
        self.peer += o.peer;
        self.deferred += o.deferred;
    }

    /// Adds `d` to the tier `kind`.
    pub fn add(&mut self, kind: TierKind, d: Duration) {
        match kind {
            TierKind::Memory => self.memory += d,
            TierKind::Disk => self.disk += d,
            TierKind::Object => self.object += d,
            TierKind::Peer => self.peer += d,
        }
    }
    /// Sum over tiers.
    pub fn total(&self) -> Duration {
        self.memory + self.disk + self.object + self.peer
    }
}

/// Where a lookup found one block: a tier of this node or of another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The tier it sits in (a peer's memory or disk, not [`TierKind::Peer`]).
    pub tier: TierKind,
    /// The node holding it; `None` for this node and for the object store.
    pub peer: Option<crate::cluster::PeerId>,
}

impl Place {
    /// A tier of this node (or the object store).
    pub fn here(tier: TierKind) -> Self {
        Self { tier, peer: None }
    }
    /// Another node's memory or disk.
    pub fn peer(peer: crate::cluster::PeerId, tier: TierKind) -> Self {
        Self {
            tier,
            peer: Some(peer),
        }
    }
    /// The tier as `LookupResponse.tiers` reports it (another node's tiers
    /// are [`TierKind::Peer`]).
    pub fn reported(&self) -> TierKind {
        if self.peer.is_some() {
            TierKind::Peer
        } else {
            self.tier
        }
    }
}

/// Result of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOutcome {
    /// Leading keys present.
    pub found: usize,
    /// Tier of each found key ([`TierKind::Peer`] for another node's).
    pub tiers: Vec<TierKind>,
    /// Where each found key sits: its tier, and the node for another node's
    /// (by name, as `--cluster-self` gives it). Same length as `tiers`.
    pub places: Vec<(TierKind, Option<String>)>,
    /// Lease on the found prefix, when one was asked for and something was found.
    pub lease: Option<LeaseGrant>,
}

/// Result of a write: the tiers' own [`PutOutcome`] (newly stored, or an
/// identical block was already there).
pub type WriteOutcome = PutOutcome;

/// Engine-wide counters.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    /// Per tier, top first.
    pub tiers: Vec<(TierKind, TierStats)>,
    /// Leases currently active.
    pub active_leases: u64,
    /// Bytes leases pin now (charged against `engine.max_pinned`).
    pub pinned_bytes: u64,
    /// Leases cut short or refused by the pin caps.
    pub lease_refusals: u64,
    /// Writes acknowledged although the disk tier refused them (memory only).
    pub degraded_writes: u64,
    /// Blocks evicted from memory and written to disk.
    pub demotions: u64,
    /// Demotions that failed (the block was dropped).
    pub demotion_failures: u64,
    /// Object-store tier counters, when one is configured.
    pub object: Option<ObjectStats>,
}

/// How writes reach the disk tier. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WritePolicy {
    /// Write to memory and disk before acknowledging (the default).
    #[default]
    WriteThrough,
    /// Write to memory; demote to disk on eviction.
    WriteBack,
}
