//! The tier against real Azurite and MinIO: round trip, the emulator's own
//! files tampered with, per-namespace containers.
use bytes::Bytes;
use kvtier_core::block::{Block, BlockId};
use kvtier_core::tier::Tier;
use kvtier_core::{Key, Namespace};
use kvtier_object::testing::Emulator;
use kvtier_object::{ObjectTier, ObjectTierConfig};

fn block(ns: &str, k: &str, n: usize) -> Block {
    let id = BlockId::new(
        Namespace::new(ns).unwrap(),
        Key::new(Bytes::copy_from_slice(k.as_bytes())).unwrap(),
    );
    let payload: Vec<u8> = (0..n).map(|i| (i * 31 + k.len()) as u8).collect();
    Block::new(id, None, 128, Bytes::from(payload))
}

async fn roundtrip(em: Emulator) {
    em.create_container("kvtier").unwrap();
    em.create_container("tenant-b").unwrap();
    let cfg = ObjectTierConfig {
        url: em.url("kvtier", "prefix"),
        namespaces: vec![("b".into(), em.url("tenant-b", ""))],
        options: em.options(),
        ..Default::default()
    };
    let t = ObjectTier::open(cfg).unwrap();
    let a = block("a", "k1", 1 << 20);
    let b = block("b", "k2", 1000);
    for x in [&a, &b] {
        assert!(!t.contains(&x.meta.id).await.unwrap());
        t.clear_cache();
        t.put(x.clone()).await.unwrap();
        t.clear_cache();
        assert!(t.contains(&x.meta.id).await.unwrap(), "{:?}", em.kind);
        assert_eq!(t.get(&x.meta.id).await.unwrap().unwrap(), *x);
    }
    // Tamper with the object through the store: detected, not served.
    let (store, path) = t.locate(&a.meta.id).unwrap();
    let mut raw = store
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    raw[5000] ^= 1;
    store.put(&path, raw.into()).await.unwrap();
    assert!(t.get(&a.meta.id).await.unwrap().is_none());
    assert_eq!(t.delete(&b.meta.id).await.unwrap(), 1);
    assert!(t.get(&b.meta.id).await.unwrap().is_none());
}

#[tokio::test]
async fn azurite_roundtrip_corruption_and_tenant_containers() {
    roundtrip(Emulator::azurite().expect("Azurite")).await;
}

#[tokio::test]
async fn minio_roundtrip_corruption_and_tenant_buckets() {
    roundtrip(Emulator::minio().expect("MinIO")).await;
}
