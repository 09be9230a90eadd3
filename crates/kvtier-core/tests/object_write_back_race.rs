//! Object-store write-back with a full upload queue: a writer whose upload
//! cannot be queued in time fails and removes the local copy, but never one
//! that a concurrent writer of the same block was acknowledged for.
mod common;
use async_trait::async_trait;
use common::{chain_with, ns};
use kvtier_core::error::ErrorKind;
use kvtier_core::tier::PutOutcome;
use kvtier_core::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// An object store whose uploads wait for the test to open its gate.
struct GatedStore {
    gate: Semaphore,
    blocks: Mutex<HashMap<BlockId, Block>>,
}

impl Default for GatedStore {
    fn default() -> Self {
        Self {
            gate: Semaphore::new(0),
            blocks: Mutex::default(),
        }
    }
}

#[async_trait]
impl Tier for GatedStore {
    fn kind(&self) -> TierKind {
        TierKind::Object
    }
    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        Ok(self.blocks.lock().get(id).cloned())
    }
    async fn contains(&self, id: &BlockId) -> Result<bool> {
        Ok(self.blocks.lock().contains_key(id))
    }
    async fn put(&self, block: Block) -> Result<PutOutcome> {
        self.gate.acquire().await.expect("open").forget();
        self.blocks.lock().insert(block.meta.id.clone(), block);
        Ok(PutOutcome::Stored)
    }
    async fn delete(&self, id: &BlockId) -> Result<u64> {
        Ok(self.blocks.lock().remove(id).map_or(0, |_| 1))
    }
    fn stats(&self) -> TierStats {
        TierStats::default()
    }
}

/// An engine over `store` with write-back through a queue of one upload,
/// whose writes wait at most `enqueue_timeout` for it.
fn write_back(store: &Arc<GatedStore>, enqueue_timeout: Duration) -> Engine {
    Engine::builder(EngineConfig::default())
        .object(
            store.clone(),
            ObjectOptions {
                policy: ObjectWritePolicy::WriteBack,
                queue_capacity: 1,
                upload_concurrency: 1,
                enqueue_timeout,
                ..Default::default()
            },
        )
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_enqueue_keeps_a_block_a_concurrent_writer_was_acknowledged_for() {
    let store = Arc::new(GatedStore::default());
    let e = Arc::new(write_back(&store, Duration::from_secs(10)));
    let n = ns("t");
    let blocks = chain_with(&n, 9, 2, |i| vec![i as u8; 1024]);
    let mut t = StorageTiming::default();
    // One upload stuck in the store: the queue (of one) is full.
    e.write(blocks[0].clone(), &mut t).await.unwrap();
    let x = blocks[1].clone();
    // Writer 1 has 300 ms: it stores X locally, then cannot queue it.
    let first = {
        let (e, x) = (e.clone(), x.clone());
        tokio::spawn(deadline::scope(
            Some(Instant::now() + Duration::from_millis(300)),
            async move { e.write(x, &mut StorageTiming::default()).await },
        ))
    };
    let until = Instant::now() + Duration::from_secs(10);
    while !e.memory().contains_block(&x.meta.id) {
        assert!(Instant::now() < until, "writer 1 never stored X");
        tokio::task::yield_now().await;
    }
    // Writer 2, with time to spare, writes the same X meanwhile.
    let second = {
        let (e, x) = (e.clone(), x.clone());
        tokio::spawn(async move { e.write(x, &mut StorageTiming::default()).await })
    };
    let r1 = first.await.unwrap();
    assert_eq!(r1.unwrap_err().kind, ErrorKind::Unavailable);
    // The store catches up; writer 2's upload is queued and acknowledged.
    store.gate.add_permits(1000);
    second.await.unwrap().unwrap();
    assert!(
        e.memory().contains_block(&x.meta.id),
        "an acknowledged block was removed by the other writer's failure"
    );
    assert!(e.flush_object_uploads(Duration::from_secs(10)).await);
    assert!(
        store.blocks.lock().contains_key(&x.meta.id),
        "X never uploaded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_nobody_was_acknowledged_for_is_not_kept() {
    let store = Arc::new(GatedStore::default());
    let e = write_back(&store, Duration::from_millis(200));
    let n = ns("t");
    let blocks = chain_with(&n, 7, 2, |i| vec![i as u8; 1024]);
    let mut t = StorageTiming::default();
    e.write(blocks[0].clone(), &mut t).await.unwrap();
    let err = e.write(blocks[1].clone(), &mut t).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unavailable);
    assert!(!e.memory().contains_block(&blocks[1].meta.id));
    store.gate.add_permits(1000);
}
