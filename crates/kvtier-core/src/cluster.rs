//! Placement of blocks over the nodes of a cluster, and the seam through
//! which the engine reaches the other nodes.
//!
//! Every block is placed on its own (not by chain segment): its owners are
//! the nodes with the highest rendezvous score
//! `u64_be(sha256(node ‖ 0x00 ‖ namespace ‖ 0x00 ‖ key)[..8])`, ties broken
//! by the node's name. Clients place requests with the same function (Rust:
//! `kvtier-client`, Python: `kvtier.keys.owners`; golden vectors in
//! `tests/vectors/placement.json`), so a client that knows the node list
//! sends each block to an owner directly. Per-block placement spreads one
//! chain over every node; a lookup still costs one parallel round trip,
//! because the engine asks each peer once for all the keys it owns (see
//! `docs/cluster.md` for the measurement behind the choice).
//!
//! The engine never talks to the network itself: it asks a [`Peers`]
//! implementation (the server's, over gRPC) which nodes own a block and to
//! look up, read, store or delete on one of them. A request that arrives
//! from a peer is served by the engine's local twin ([`crate::Engine::local_twin`]),
//! which has no peers and no object store, so requests never bounce.
use crate::block::{Block, BlockId};
use crate::error::Result;
use crate::keys::{Key, Namespace};
use crate::tier::Overwrite;
use crate::tier::TierKind;
use async_trait::async_trait;
use sha2::{Digest, Sha256};

/// A node's name in placement: `host:port`, from `grpc://host:port`,
/// `http://host:port` or a bare `host:port` (a trailing `/` dropped). The
/// server names its nodes and the clients place blocks with this one
/// function. Refused unless the port is in 1..=65535.
pub fn node_name(addr: &str) -> crate::error::Result<String> {
    let rest = addr
        .strip_prefix("grpc://")
        .or_else(|| addr.strip_prefix("http://"))
        .unwrap_or(addr)
        .trim_end_matches('/');
    let ok = rest
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0));
    if !ok {
        return Err(crate::error::Error::invalid(format!(
            "cluster node {addr:?} is not grpc://host:port (with a port other than 0)"
        )));
    }
    Ok(rest.to_string())
}

/// Index of a peer in its [`Peers`] implementation.
pub type PeerId = usize;

/// The rendezvous score of `node` for one block.
pub fn score(node: &str, ns: &str, key: &[u8]) -> u64 {
    let mut h = Sha256::new();
    h.update(node.as_bytes());
    h.update([0]);
    h.update(ns.as_bytes());
    h.update([0]);
    h.update(key);
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// `nodes` ordered by their score for one block, best first (ties by name).
pub fn rank<'a>(nodes: &'a [String], ns: &str, key: &[u8]) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = nodes
        .iter()
        .map(|n| (score(n, ns, key), n.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.into_iter().map(|(_, n)| n).collect()
}

/// Where one block lives: the first `replicas` live nodes of its ranking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    /// This node is one of the owners.
    pub local: bool,
    /// The owners that are other nodes, best first.
    pub peers: Vec<PeerId>,
}

/// The other nodes of a cluster, as the engine sees them.
///
/// Failures are the implementation's to count and to act on (a peer that
/// fails is skipped for a while); the engine treats an error as "not there"
/// and goes on to the next owner or the object store.
#[async_trait]
pub trait Peers: Send + Sync + 'static {
    /// The live owners of `id`.
    fn owners(&self, id: &BlockId) -> Owners;
    /// Every live node in `id`'s rank order, best first, this node as
    /// `None`: past the owners, the nodes that become owners as owners are
    /// lost (a write whose replica failed places its copy on the next one).
    fn ranked(&self, id: &BlockId) -> Vec<Option<PeerId>>;
    /// Every live peer (deletes go to all of them: a chain's descendants may
    /// live anywhere).
    fn live(&self) -> Vec<PeerId>;
    /// The tier (memory or disk) of each leading key of `keys` that `peer`
    /// holds; its length is how many it holds.
    async fn lookup(&self, peer: PeerId, ns: &Namespace, keys: &[Key]) -> Result<Vec<TierKind>>;
    /// The node's name as lookups report it (`--cluster-self`, no scheme).
    fn name(&self, peer: PeerId) -> String {
        format!("peer-{peer}")
    }
    /// The block, if `peer` holds it in its memory or disk.
    async fn get(&self, peer: PeerId, id: &BlockId) -> Result<Option<Block>>;
    /// Stores a replica on `peer` (its memory and disk only).
    async fn put(&self, peer: PeerId, block: Block, mode: Overwrite) -> Result<()>;
    /// Deletes on `peer` (memory and disk); how many blocks it removed.
    async fn delete(&self, peer: PeerId, id: &BlockId) -> Result<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{i}:50051")).collect()
    }

    #[test]
    fn ranking_is_a_permutation_and_deterministic() {
        let ns = nodes(5);
        let a = rank(&ns, "tenant/model", b"key-1");
        let b = rank(&ns, "tenant/model", b"key-1");
        assert_eq!(a, b);
        let mut sorted: Vec<&str> = a.clone();
        sorted.sort();
        let mut want: Vec<&str> = ns.iter().map(String::as_str).collect();
        want.sort();
        assert_eq!(sorted, want);
    }

    #[test]
    fn placements_spread_evenly_and_a_new_node_moves_about_one_in_n() {
        let three = nodes(3);
        let four = nodes(4);
        let mut first = std::collections::HashMap::<&str, usize>::new();
        let mut moved = 0;
        let n = 20_000;
        for i in 0..n {
            let key = format!("k{i}");
            let a = rank(&three, "ns", key.as_bytes())[0];
            *first.entry(a).or_default() += 1;
            let b = rank(&four, "ns", key.as_bytes())[0];
            if a != b {
                assert_eq!(b, "10.0.0.3:50051", "only the new node takes placements");
                moved += 1;
            }
        }
        for (node, c) in first {
            let share = c as f64 / n as f64;
            assert!((share - 1.0 / 3.0).abs() < 0.02, "{node} has {share}");
        }
        let share = moved as f64 / n as f64;
        assert!((share - 0.25).abs() < 0.02, "{share} of placements moved");
    }
}
