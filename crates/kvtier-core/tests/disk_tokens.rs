//! Token ids in disk records (docs/disk-format.md, flag bit 2): a block
//! written with its token ids is read back with them, and after a restart the
//! disk tier announces each recovered record's ids before the record itself,
//! so a KV-event consumer that matches blocks by tokens (llm-d) still finds
//! them (docs/events.md). A format-1 directory is upgraded in place.
mod common;
use common::disk::{cfg, chain_blocks, open};
use common::ns;
use kvtier_core::disk::SyncMode;
use kvtier_core::events::{EventSink, Medium};
use kvtier_core::*;
use parking_lot::Mutex;
use std::sync::Arc;

/// What a sink was told: `stored`, `removed` or `tokens`, the block, its ids.
type Told = (String, BlockId, Option<Vec<u32>>);

#[derive(Default)]
struct Log(Mutex<Vec<Told>>);

impl EventSink for Log {
    fn change(&self, medium: Medium, stored: bool, id: &BlockId, _parent: Option<&Key>) {
        assert_eq!(medium, Medium::Disk);
        let what = if stored { "stored" } else { "removed" };
        self.0.lock().push((what.into(), id.clone(), None));
    }
    fn tokens(&self, id: &BlockId, tokens: Arc<[u32]>) {
        self.0
            .lock()
            .push(("tokens".into(), id.clone(), Some(tokens.to_vec())));
    }
}

/// 16-token blocks and one of 4096 tokens, whose header (16 KiB of ids) is
/// longer than the first read of a header at open; 4 MiB payloads.
fn written(n: &Namespace) -> Vec<Block> {
    let mut chain = chain_blocks(n, 3, 3, 4 << 20);
    for (i, b) in chain.iter_mut().enumerate() {
        let count = if i == 2 { 4096 } else { 16 };
        b.meta.token_count = count;
        b.tokens = (i != 1).then(|| (0..count).map(|t| 100_000 * i as u32 + t).collect());
    }
    chain
}

async fn recovered(dir: &std::path::Path, keep: bool, verify: bool) -> (Vec<Block>, Log) {
    let mut c = cfg(dir, 1 << 30, SyncMode::Always);
    (c.keep_tokens, c.verify_on_open) = (keep, verify);
    let (tier, rep) = open(c);
    assert_eq!(rep.blocks, 3);
    let log = Arc::new(Log::default());
    tier.observe(log.clone());
    let mut ids: Vec<BlockId> = log.0.lock().iter().map(|(_, id, _)| id.clone()).collect();
    ids.dedup();
    let mut got = Vec::new();
    for id in &ids {
        if !got.iter().any(|b: &Block| &b.meta.id == id) {
            got.push(tier.get(id).await.unwrap().expect("recovered"));
        }
    }
    drop(tier);
    (got, Arc::try_unwrap(log).ok().expect("one owner"))
}

#[tokio::test]
async fn token_ids_survive_a_restart_and_are_announced_before_their_record() {
    let dir = tempfile::tempdir().unwrap();
    let chain = written(&ns("t/m"));
    {
        let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
        for b in &chain {
            tier.put(b.clone()).await.unwrap();
            let back = tier.get(&b.meta.id).await.unwrap().unwrap();
            assert_eq!(back.tokens, b.tokens, "read back as written");
        }
    }
    for verify in [true, false] {
        let (blocks, log) = recovered(dir.path(), true, verify).await;
        let log = log.0.into_inner();
        for b in &chain {
            let at = |what: &str| {
                log.iter()
                    .position(|(w, id, _)| w == what && id == &b.meta.id)
            };
            let stored = at("stored").expect("every record is announced");
            match &b.tokens {
                Some(t) => {
                    let told = at("tokens").expect("its ids are announced");
                    assert!(
                        told < stored,
                        "ids before the record (verify_on_open {verify})"
                    );
                    assert_eq!(log[told].2.as_deref(), Some(&t[..]));
                }
                None => assert_eq!(at("tokens"), None, "a block written without ids has none"),
            }
            let back = blocks.iter().find(|x| x.meta.id == b.meta.id).unwrap();
            assert_eq!((&back.payload, &back.tokens), (&b.payload, &b.tokens));
        }
    }
    // Not kept when nothing announces them (KV events off).
    let (_, log) = recovered(dir.path(), false, true).await;
    assert!(log.0.into_inner().iter().all(|(w, _, _)| w != "tokens"));
}

#[tokio::test]
async fn a_format_1_directory_is_opened_upgraded_and_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut chain = written(&ns("t/m"));
    for b in &mut chain {
        b.tokens = None; // what a format-1 build wrote
    }
    {
        let (tier, _) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
        for b in &chain {
            tier.put(b.clone()).await.unwrap();
        }
    }
    let format = dir.path().join("FORMAT");
    assert_eq!(
        std::fs::read_to_string(&format).unwrap(),
        "kvtier-disk-format 2\n"
    );
    std::fs::write(&format, "kvtier-disk-format 1\n").unwrap();
    let (tier, rep) = open(cfg(dir.path(), 1 << 30, SyncMode::Always));
    assert_eq!((rep.blocks, rep.dropped()), (3, 0));
    assert_eq!(
        std::fs::read_to_string(&format).unwrap(),
        "kvtier-disk-format 2\n"
    );
    for b in &chain {
        assert_eq!(tier.get(&b.meta.id).await.unwrap().as_ref(), Some(b));
    }
}
