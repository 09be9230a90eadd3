//! A cluster write whose replica fails without its peer being marked down
//! (the peer sheds load, or its memory is full) still ends with as many
//! copies as the block has owners: the next node of the ranking takes the
//! one that failed, so losing one node loses nothing acknowledged.
mod common;
use async_trait::async_trait;
use common::{chain_with, ns};
use kvtier_core::cluster::{Owners, PeerId, Peers};
use kvtier_core::error::Error;
use kvtier_core::tier::{Overwrite, TierKind};
use kvtier_core::*;
use std::sync::Arc;

/// Nodes 1 and 2 as memory-only engines; ranking for every block: this node,
/// 1, 2; two replicas. Node 1 refuses every write, as a shedding node does,
/// and stays live.
struct Fake {
    nodes: Vec<Engine>,
}

#[async_trait]
impl Peers for Fake {
    fn owners(&self, _: &BlockId) -> Owners {
        Owners {
            local: true,
            peers: vec![1],
        }
    }
    fn ranked(&self, _: &BlockId) -> Vec<Option<PeerId>> {
        vec![None, Some(1), Some(2)]
    }
    fn live(&self) -> Vec<PeerId> {
        vec![1, 2]
    }
    async fn lookup(&self, p: PeerId, ns: &Namespace, keys: &[Key]) -> Result<Vec<TierKind>> {
        let l = self.nodes[p - 1]
            .lookup(ns, keys, None, &mut StorageTiming::default())
            .await?;
        Ok(l.tiers)
    }
    async fn get(&self, p: PeerId, id: &BlockId) -> Result<Option<Block>> {
        let r = self.nodes[p - 1]
            .read(id, &mut StorageTiming::default())
            .await?;
        Ok(r.map(|(b, _)| b))
    }
    async fn put(&self, p: PeerId, block: Block, _: Overwrite) -> Result<()> {
        if p == 1 {
            return Err(Error::unavailable("shedding load; retry after 5 ms"));
        }
        self.nodes[p - 1]
            .write(block, &mut StorageTiming::default())
            .await
            .map(|_| ())
    }
    async fn delete(&self, p: PeerId, id: &BlockId) -> Result<u64> {
        self.nodes[p - 1]
            .delete(id, &mut StorageTiming::default())
            .await
    }
}

#[tokio::test]
async fn a_failed_replica_goes_to_the_next_node_of_the_ranking() {
    let fake = Arc::new(Fake {
        nodes: vec![
            Engine::new(EngineConfig::default()),
            Engine::new(EngineConfig::default()),
        ],
    });
    let e = Engine::builder(EngineConfig::default())
        .peers(fake.clone())
        .build();
    let b = chain_with(&ns("t"), 5, 1, |_| vec![5; 4096]).remove(0);
    let out = e.write(b.clone(), &mut StorageTiming::default()).await;
    assert_eq!(out.unwrap(), WriteOutcome::Stored);
    assert!(e.memory().contains_block(&b.meta.id), "no local copy");
    assert!(
        fake.nodes[1].memory().contains_block(&b.meta.id),
        "the block has one copy: node 2 never got the replica node 1 refused"
    );
    assert!(!fake.nodes[0].memory().contains_block(&b.meta.id));
}
