//! Read honours the request deadline: with a slow tier below memory, a Read
//! returns the blocks it has before the deadline, flagged partial.
mod common;

use async_trait::async_trait;
use bytes::Bytes;
use kvtier_core::tier::PutOutcome;
use kvtier_core::*;
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tier that has every block but takes 300 ms per access.
struct SlowTier;

#[async_trait]
impl Tier for SlowTier {
    fn kind(&self) -> TierKind {
        TierKind::Object
    }
    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(Some(Block::new(
            id.clone(),
            None,
            0,
            Bytes::from_static(b"slow"),
        )))
    }
    async fn contains(&self, _id: &BlockId) -> Result<bool> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(true)
    }
    async fn put(&self, _b: Block) -> Result<PutOutcome> {
        Ok(PutOutcome::Stored)
    }
    async fn delete(&self, _id: &BlockId) -> Result<u64> {
        Ok(0)
    }
    fn stats(&self) -> TierStats {
        TierStats::default()
    }
}

#[tokio::test]
async fn read_returns_what_it_has_before_the_deadline() {
    let cfg = common::test_config();
    let engine = Arc::new(
        Engine::builder(cfg.engine.engine_config())
            .object(
                Arc::new(SlowTier),
                ObjectOptions {
                    read_ahead: 4,
                    ..Default::default()
                },
            )
            .build(),
    );
    let server = kvtier_server::Server::start_with_engine(cfg, engine)
        .await
        .unwrap();
    let c = common::client_for(&server).await;
    // Two blocks in memory, then blocks only the slow tier has.
    c.write(
        "n",
        &[
            kvtier_client::WriteBlock {
                token_ids: Vec::new(),
                key: Key::new(&b"a"[..]).unwrap(),
                parent: None,
                token_count: 0,
                payload: Bytes::from_static(b"A"),
                ttl_ms: 0,
            },
            kvtier_client::WriteBlock {
                token_ids: Vec::new(),
                key: Key::new(&b"b"[..]).unwrap(),
                parent: None,
                token_count: 0,
                payload: Bytes::from_static(b"B"),
                ttl_ms: 0,
            },
        ],
    )
    .await
    .unwrap();
    let mut raw = KvTierClient::connect(common::raw_endpoint(&server))
        .await
        .unwrap();
    let keys: Vec<Bytes> = [
        &b"a"[..],
        b"b",
        b"c",
        b"d",
        b"e",
        b"f",
        b"g",
        b"h",
        b"i",
        b"j",
    ]
    .iter()
    .map(|k| Bytes::copy_from_slice(k))
    .collect();
    let mut req = tonic::Request::new(pb::ReadRequest {
        namespace: "n".into(),
        keys,
        lease_id: 0,
    });
    req.set_timeout(Duration::from_millis(450));
    let t0 = Instant::now();
    let mut stream = raw.read(req).await.unwrap().into_inner();
    let mut got = Vec::new();
    let mut done = None;
    while let Some(msg) = stream.message().await.unwrap() {
        match msg.item.unwrap() {
            pb::read_response::Item::Block(b) => got.push(b.block.unwrap().payload),
            pb::read_response::Item::Done(d) => done = Some(d),
        }
    }
    let elapsed = t0.elapsed();
    let done = done.expect("a final ReadDone before the deadline");
    // a, b from memory; c..f from the slow tier, read ahead together
    // (read_ahead = 4: all four start at once and end at ~300 ms); g starts
    // when c is handed out and would end past 450 ms. Serially only c would
    // have made it.
    let mut want = vec![Bytes::from_static(b"A"), Bytes::from_static(b"B")];
    want.extend(std::iter::repeat_n(Bytes::from_static(b"slow"), 4));
    assert_eq!(got, want);
    assert!(done.partial);
    assert_eq!(done.reason, "deadline");
    assert_eq!((done.returned, done.requested), (6, 10));
    assert!(elapsed < Duration::from_millis(1500), "took {elapsed:?}");
    let t = done.timing.unwrap();
    assert!(
        t.storage_object_us >= 300_000,
        "object-tier time measured: {t:?}"
    );
    assert!(t.total_us >= t.storage_object_us);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn data_plane_read_returns_partial_before_the_client_deadline() {
    let cfg = common::test_config();
    let engine = Arc::new(
        Engine::builder(cfg.engine.engine_config())
            .object(
                Arc::new(SlowTier),
                ObjectOptions {
                    read_ahead: 4,
                    ..Default::default()
                },
            )
            .build(),
    );
    let server = kvtier_server::Server::start_with_engine(cfg, engine)
        .await
        .unwrap();
    let mut cc = kvtier_client::ClientConfig::new(common::raw_endpoint(&server));
    cc.timeout = Duration::from_millis(500);
    let c = kvtier_client::Client::connect(cc).await.unwrap();
    assert!(c.data_plane().is_some());
    c.write(
        "n",
        &[kvtier_client::WriteBlock {
            token_ids: Vec::new(),
            key: Key::new(&b"a"[..]).unwrap(),
            parent: None,
            token_count: 0,
            payload: Bytes::from_static(b"A"),
            ttl_ms: 0,
        }],
    )
    .await
    .unwrap();
    let keys: Vec<Key> = [&b"a"[..], b"s", b"t", b"u", b"v", b"w", b"x", b"y", b"z"]
        .iter()
        .map(|k| Key::new(Bytes::copy_from_slice(k)).unwrap())
        .collect();
    let t0 = Instant::now();
    let r = c.read("n", &keys, 0).await.unwrap();
    // Server deadline 450 ms: "a" from memory, then s..v from the slow tier,
    // read ahead together (~300 ms); w would end past the deadline.
    assert_eq!(r.blocks.len(), 5);
    assert!(r.partial);
    assert_eq!(r.reason, "deadline");
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    server.shutdown().await.unwrap();
}
