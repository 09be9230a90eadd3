//! Helpers the core's integration tests share: namespaces and chains of
//! blocks built with the real key scheme (4 tokens per block); the disk
//! tier's in [`disk`].
#![allow(dead_code)] // each test binary uses its own subset
pub mod disk;

use bytes::Bytes;
use kvtier_core::*;

pub fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

/// A chain of `n` blocks keyed by the chained hash of tokens derived from
/// `seed`; block `i`'s payload is `payload(i)`.
pub fn chain_with(
    ns_: &Namespace,
    seed: u32,
    n: usize,
    payload: impl Fn(usize) -> Vec<u8>,
) -> Vec<Block> {
    let tokens: Vec<u32> = (0..(n * 4) as u32)
        .map(|t| t.wrapping_mul(7919) ^ seed)
        .collect();
    let keys = HashFn::default().chain(&tokens, 4).unwrap();
    keys.iter()
        .enumerate()
        .map(|(i, k)| {
            let parent = (i > 0).then(|| keys[i - 1].clone());
            Block::new(
                BlockId::new(ns_.clone(), k.clone()),
                parent,
                4,
                Bytes::from(payload(i)),
            )
        })
        .collect()
}
