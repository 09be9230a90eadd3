//! Write-through with a memory tier smaller than the writes in flight: memory
//! can evict a block before its own disk write lands. That block must not be
//! demoted (written a second time) meanwhile; every fresh write reports
//! `Stored`, exactly once on disk.
use bytes::Bytes;
use kvtier_core::{
    Block, BlockId, ByteSize, DiskConfig, DiskTier, Engine, EngineConfig, Key, Namespace,
    StorageTiming, SyncMode, WriteOutcome, WritePolicy,
};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fresh_writes_are_stored_not_existing_under_memory_pressure() {
    let dir = tempfile::tempdir().unwrap();
    let mut dc = DiskConfig::new(dir.path(), ByteSize::gib(1));
    dc.sync = SyncMode::Always;
    let (disk, _) = DiskTier::open(dc).unwrap();
    let cfg = EngineConfig {
        memory_capacity: ByteSize::mib(1),
        max_block_size: ByteSize::mib(1),
        ..Default::default()
    };
    let engine = Arc::new(
        Engine::builder(cfg)
            .disk(Some(Arc::new(disk)), WritePolicy::WriteThrough)
            .build(),
    );
    let ns = Namespace::new("race").unwrap();
    let payload = Bytes::from(vec![7u8; 200 << 10]);
    let mut tasks = Vec::new();
    for w in 0..16u32 {
        let (engine, ns, payload) = (engine.clone(), ns.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut existing = 0;
            for i in 0..12u32 {
                let key = Key::new(format!("{w}-{i}").into_bytes()).unwrap();
                let b = Block::new(BlockId::new(ns.clone(), key), None, 16, payload.clone());
                if engine
                    .write(b, &mut StorageTiming::default())
                    .await
                    .unwrap()
                    == WriteOutcome::Existing
                {
                    existing += 1;
                }
            }
            existing
        }));
    }
    let mut existing = 0;
    for t in tasks {
        existing += t.await.unwrap();
    }
    let stats = engine.stats();
    assert_eq!(
        existing, 0,
        "fresh writes reported as existing (demoted while being written through)"
    );
    assert_eq!(
        stats.demotions, 0,
        "write-through never needs to demote: {stats:?}"
    );
    assert_eq!(engine.disk().unwrap().disk_stats().tier.blocks, 16 * 12);
}
