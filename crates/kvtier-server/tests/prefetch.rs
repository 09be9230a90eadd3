//! The cold object-store path (notes/023, docs/object-store.md): a lookup that
//! finds blocks only in the store prefetches them into memory, a read joins a
//! fetch already under way instead of sending a second GET, and a prefix read
//! keeps `object_store.read_ahead` fetches in flight.
mod common;

use async_trait::async_trait;
use bytes::Bytes;
use kvtier_core::tier::PutOutcome;
use kvtier_core::*;
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A store that has every block (its payload is its key) and answers each GET
/// after `delay`, counting them.
struct CountingStore {
    delay: Duration,
    gets: AtomicU64,
}

impl CountingStore {
    fn new(delay_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            delay: Duration::from_millis(delay_ms),
            gets: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl Tier for CountingStore {
    fn kind(&self) -> TierKind {
        TierKind::Object
    }
    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let payload = Bytes::copy_from_slice(id.key.as_bytes());
        Ok(Some(Block::new(id.clone(), None, 0, payload)))
    }
    async fn contains(&self, _id: &BlockId) -> Result<bool> {
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

fn keys(n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| Bytes::from(format!("block-{i:03}")))
        .collect()
}

async fn start(
    store: Arc<CountingStore>,
    opts: ObjectOptions,
) -> (kvtier_server::Server, Arc<Engine>) {
    let cfg = common::test_config();
    let engine = Arc::new(
        Engine::builder(cfg.engine.engine_config())
            .object(store, opts)
            .build(),
    );
    let server = kvtier_server::Server::start_with_engine(cfg, engine.clone())
        .await
        .unwrap();
    (server, engine)
}

async fn connect(server: &kvtier_server::Server) -> KvTierClient<tonic::transport::Channel> {
    KvTierClient::connect(common::raw_endpoint(server))
        .await
        .unwrap()
}

async fn lookup(c: &mut KvTierClient<tonic::transport::Channel>, keys: &[Bytes]) -> u32 {
    c.lookup(pb::LookupRequest {
        namespace: "n".into(),
        keys: keys.to_vec(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .found_blocks
}

/// Reads `keys` in one Read; returns the payloads and the tier of each.
async fn read(
    c: &mut KvTierClient<tonic::transport::Channel>,
    keys: &[Bytes],
    timeout: Option<Duration>,
) -> (Vec<(Bytes, i32)>, pb::ReadDone) {
    let mut req = tonic::Request::new(pb::ReadRequest {
        namespace: "n".into(),
        keys: keys.to_vec(),
        lease_id: 0,
    });
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    let mut stream = c.read(req).await.unwrap().into_inner();
    let (mut got, mut done) = (Vec::new(), None);
    while let Some(msg) = stream.message().await.unwrap() {
        match msg.item.unwrap() {
            pb::read_response::Item::Block(b) => {
                got.push((b.block.unwrap().payload, b.tier));
            }
            pb::read_response::Item::Done(d) => done = Some(d),
        }
    }
    (got, done.expect("a final ReadDone"))
}

/// Waits (by probing, at most 10 s) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_lookup_prefetches_what_only_the_store_has() {
    let store = CountingStore::new(50);
    let (server, engine) = start(store.clone(), ObjectOptions::default()).await;
    let mut c = connect(&server).await;
    let ks = keys(8);
    assert_eq!(lookup(&mut c, &ks).await, 8);
    let prefetched = || engine.stats().object.unwrap().prefetched;
    until("the lookup's prefetch", || prefetched() == 8).await;
    assert_eq!(store.gets.load(Ordering::SeqCst), 8);
    // The read that follows is served from memory: no GET more.
    let (got, done) = read(&mut c, &ks, None).await;
    assert_eq!(done.returned, 8);
    for (i, (payload, tier)) in got.iter().enumerate() {
        assert_eq!(payload, &ks[i]);
        assert_eq!(*tier, pb::Tier::Memory as i32, "block {i}");
    }
    assert_eq!(store.gets.load(Ordering::SeqCst), 8);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_read_right_after_the_lookup_joins_its_fetches() {
    // Slow enough that the read arrives while the prefetch's GETs are out.
    let store = CountingStore::new(400);
    let (server, engine) = start(store.clone(), ObjectOptions::default()).await;
    let mut c = connect(&server).await;
    let ks = keys(8);
    assert_eq!(lookup(&mut c, &ks).await, 8);
    let (got, done) = read(&mut c, &ks, None).await;
    assert_eq!(done.returned, 8);
    let payloads: Vec<Bytes> = got.into_iter().map(|(p, _)| p).collect();
    assert_eq!(payloads, ks);
    // One GET per block, shared by the prefetch and the read.
    assert_eq!(store.gets.load(Ordering::SeqCst), 8);
    let o = engine.stats().object.unwrap();
    assert_eq!(o.fetches, 8);
    assert!(o.fetches_joined >= 1, "{o:?}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn with_prefetch_off_a_lookup_reads_nothing() {
    // GETs slow enough that a prefetch would still be under way when the
    // read arrives: the read would then join its fetches (or find blocks in
    // memory), which is what this checks does not happen.
    let store = CountingStore::new(50);
    let opts = ObjectOptions {
        prefetch: false,
        ..Default::default()
    };
    let (server, engine) = start(store.clone(), opts).await;
    let mut c = connect(&server).await;
    let ks = keys(8);
    assert_eq!(lookup(&mut c, &ks).await, 8);
    let (got, done) = read(&mut c, &ks, None).await;
    assert_eq!(done.returned, 8);
    assert!(got.iter().all(|(_, t)| *t == pb::Tier::Object as i32));
    let o = engine.stats().object.unwrap();
    assert_eq!((o.fetches, o.fetches_joined, o.prefetched), (8, 0, 0));
    assert_eq!(store.gets.load(Ordering::SeqCst), 8);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_prefix_read_keeps_read_ahead_fetches_in_flight() {
    // 16 blocks at 300 ms each, read without a lookup (no prefetch) under a
    // 700 ms deadline: with read_ahead = 16 all are fetched at once; one at a
    // time, two would make it.
    let store = CountingStore::new(300);
    let opts = ObjectOptions {
        read_ahead: 16,
        ..Default::default()
    };
    let (server, _engine) = start(store.clone(), opts).await;
    let mut c = connect(&server).await;
    let ks = keys(16);
    let (got, done) = read(&mut c, &ks, Some(Duration::from_millis(700))).await;
    assert_eq!(done.returned, 16, "{done:?}");
    assert_eq!(got.len(), 16);
    assert!(got.iter().all(|(_, t)| *t == pb::Tier::Object as i32));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn concurrent_reads_of_one_block_send_one_get() {
    let store = CountingStore::new(200);
    let (server, engine) = start(store.clone(), ObjectOptions::default()).await;
    let id = BlockId::new(
        Namespace::new("n").unwrap(),
        Key::new(&b"shared-block"[..]).unwrap(),
    );
    let reads = (0..4).map(|_| {
        let (engine, id) = (engine.clone(), id.clone());
        tokio::spawn(async move {
            let mut t = StorageTiming::default();
            engine.read(&id, &mut t).await.unwrap().unwrap().0
        })
    });
    for r in futures::future::join_all(reads).await {
        assert_eq!(r.unwrap().payload, Bytes::from_static(b"shared-block"));
    }
    assert_eq!(store.gets.load(Ordering::SeqCst), 1);
    // The fetch is forgotten once done: a later miss asks the store again.
    let mut t = StorageTiming::default();
    engine.delete(&id, &mut t).await.unwrap();
    assert!(engine.read(&id, &mut t).await.unwrap().is_some());
    assert_eq!(store.gets.load(Ordering::SeqCst), 2);
    server.shutdown().await.unwrap();
}

/// A data-plane reply that fills up ends the read with reason `size` while
/// read-ahead fetches are still out. Those blocks are the ones the client
/// asks for next: they must still reach memory, not be fetched again.
#[tokio::test]
async fn reads_under_way_when_a_reply_fills_still_promote() {
    use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let store = CountingStore::new(200);
    let opts = ObjectOptions {
        read_ahead: 16,
        prefetch: false,
        ..Default::default()
    };
    let (server, engine) = start(store.clone(), opts).await;
    let ks = keys(16);
    // Room for one block: the reply ends after it with reason "size", with
    // the other 15 reads in flight.
    let meta = pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: "n".into(),
            keys: ks.clone(),
            lease_id: 0,
        }),
        timeout_ms: 5_000,
        max_reply_bytes: 1_100,
    }
    .encode_to_vec();
    let mut sock = tokio::net::TcpStream::connect(server.data_addr.unwrap())
        .await
        .unwrap();
    sock.write_all(&common::frame(Kind::Read, 1, &meta, &[]))
        .await
        .unwrap();
    let mut raw = [0u8; HEADER_LEN];
    sock.read_exact(&mut raw).await.unwrap();
    let h = Header::decode(&raw).unwrap();
    let mut m = vec![0u8; h.meta_len as usize + h.data_len as usize];
    sock.read_exact(&mut m).await.unwrap();
    let reply = pb::WireReadReply::decode(&m[..h.meta_len as usize]).unwrap();
    let done = reply.done.unwrap();
    assert_eq!((reply.blocks.len(), done.reason.as_str()), (1, "size"));

    let in_memory = || {
        engine
            .stats()
            .tiers
            .iter()
            .find(|(k, _)| *k == TierKind::Memory)
            .map_or(0, |(_, t)| t.blocks)
    };
    until("every block read ahead promoted", || in_memory() == 16).await;
    // The client's next request, for the rest, is served from memory.
    let mut c = connect(&server).await;
    let (got, done) = read(&mut c, &ks[1..], None).await;
    assert_eq!(done.returned, 15);
    assert!(got.iter().all(|(_, t)| *t == pb::Tier::Memory as i32));
    assert_eq!(store.gets.load(Ordering::SeqCst), 16);
    server.shutdown().await.unwrap();
}
