//! The engine over an object tier on local files (no emulator): write
//! policies, read-through with promotion to disk, lookups across two engines.
use bytes::Bytes;
use kvtier_core::block::{Block, BlockId};
use kvtier_core::engine::StorageTiming;
use kvtier_core::{
    ByteSize, DiskConfig, DiskTier, Engine, EngineConfig, Key, Namespace, ObjectOptions,
    ObjectWritePolicy, TierKind, WritePolicy,
};
use kvtier_object::{ObjectTier, ObjectTierConfig};
use std::sync::Arc;
use std::time::Duration;

fn engine(url: &str, policy: ObjectWritePolicy, disk: Option<Arc<DiskTier>>) -> Engine {
    let cfg = EngineConfig {
        memory_capacity: ByteSize::mib(16),
        ..Default::default()
    };
    let tier = ObjectTier::open(ObjectTierConfig {
        url: url.into(),
        ..Default::default()
    })
    .unwrap();
    Engine::builder(cfg)
        .disk(disk, WritePolicy::WriteThrough)
        .object(
            Arc::new(tier),
            ObjectOptions {
                policy,
                ..Default::default()
            },
        )
        .build()
}

fn chain(n: usize) -> Vec<Block> {
    let ns = Namespace::new("ns").unwrap();
    let mut out: Vec<Block> = Vec::new();
    for i in 0..n {
        let key = Key::new(Bytes::from(vec![b'k', i as u8])).unwrap();
        let parent = out.last().map(|b| b.meta.id.key.clone());
        out.push(Block::new(
            BlockId::new(ns.clone(), key),
            parent,
            16,
            Bytes::from(vec![i as u8; 4096]),
        ));
    }
    out
}

#[tokio::test]
async fn write_back_uploads_and_another_engine_reads_through() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let a = engine(&url, ObjectWritePolicy::WriteBack, None);
    let blocks = chain(5);
    let mut t = StorageTiming::default();
    for b in &blocks {
        a.write(b.clone(), &mut t).await.unwrap();
    }
    assert!(a.flush_object_uploads(Duration::from_secs(5)).await);
    let s = a.stats().object.unwrap();
    assert_eq!((s.uploads, s.queue_depth), (5, 0));

    let (disk, _) =
        DiskTier::open(DiskConfig::new(dir.path().join("disk"), ByteSize::mib(64))).unwrap();
    let disk = Arc::new(disk);
    let b = engine(&url, ObjectWritePolicy::WriteThrough, Some(disk.clone()));
    let keys: Vec<Key> = blocks.iter().map(|b| b.meta.id.key.clone()).collect();
    let ns = Namespace::new("ns").unwrap();
    let l = b.lookup(&ns, &keys, None, &mut t).await.unwrap();
    assert_eq!(l.found, 5);
    assert!(l.tiers.iter().all(|t| *t == TierKind::Object));
    let (got, tier) = b.read(&blocks[2].meta.id, &mut t).await.unwrap().unwrap();
    assert_eq!((got, tier), (blocks[2].clone(), TierKind::Object));
    let (_, tier) = b.read(&blocks[2].meta.id, &mut t).await.unwrap().unwrap();
    assert_eq!(tier, TierKind::Memory);
    // Copied to disk in the background.
    for _ in 0..100 {
        if disk.has(&blocks[2].meta.id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(disk.has(&blocks[2].meta.id), "promoted to disk");
    // Lookup now answers the first three locally... and 2 is local, 0/1 from the store.
    let l = b.lookup(&ns, &keys, None, &mut t).await.unwrap();
    assert_eq!(l.found, 5);
    // Write-through on B reaches the store before the ack.
    let extra = chain(7).pop().unwrap();
    b.write(extra.clone(), &mut t).await.unwrap();
    assert!(a.read(&extra.meta.id, &mut t).await.unwrap().is_some());
}

#[tokio::test]
async fn write_through_failure_keeps_nothing() {
    // A store that cannot be written: a file:// root that is a file.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let e = engine(&url, ObjectWritePolicy::WriteThrough, None);
    std::fs::remove_dir_all(dir.path().join("store")).unwrap();
    std::fs::write(dir.path().join("store"), b"not a directory").unwrap();
    let b = chain(1).pop().unwrap();
    let mut t = StorageTiming::default();
    let err = e.write(b.clone(), &mut t).await.unwrap_err();
    assert_eq!(
        err.kind,
        kvtier_core::error::ErrorKind::Unavailable,
        "{err}"
    );
    assert!(err.message.contains("object store file://"), "{err}");
    assert!(!e.memory().contains_block(&b.meta.id));
    assert_eq!(e.stats().object.unwrap().write_failures, 1);
}
