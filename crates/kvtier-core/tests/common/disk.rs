//! Disk-tier helpers the core's integration tests share (`disk_*.rs`): chains
//! whose payload bytes vary within a block, a tier config and opener, the
//! 4 KiB-rounded charge of a record, and the record files under `blocks/`.
use super::chain_with;
use kvtier_core::disk::{DiskConfig, DiskTier, SyncMode};
use kvtier_core::*;
use std::path::{Path, PathBuf};

/// Payload bytes vary within a block, so a torn or shifted record shows.
pub fn chain_blocks(ns_: &Namespace, seed: u32, n: usize, size: usize) -> Vec<Block> {
    chain_with(ns_, seed, n, |i| {
        (0..size)
            .map(|j| {
                (j as u32)
                    .wrapping_mul(31)
                    .wrapping_add(seed * 7 + i as u32) as u8
            })
            .collect()
    })
}

/// A disk tier in `dir` of capacity `cap` bytes, syncing per `sync`.
pub fn cfg(dir: &Path, cap: u64, sync: SyncMode) -> DiskConfig {
    DiskConfig {
        sync,
        ..DiskConfig::new(dir, ByteSize(cap))
    }
}

/// Opens the tier; the report says what recovery found.
pub fn open(c: DiskConfig) -> (DiskTier, RecoveryReport) {
    DiskTier::open(c).unwrap()
}

/// Charged size of a record with a 1-byte namespace... rounded: tests use
/// payloads that make every record cost exactly `blocks(size)` 4 KiB units.
pub fn cost(size: usize) -> u64 {
    (size as u64 + 200).div_ceil(4096) * 4096
}

/// Every file under `dir`'s shard directories (`blocks/xx/`).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out
}
