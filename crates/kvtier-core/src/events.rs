//! Where residency changes are reported: every block that becomes resident
//! in, or leaves, the memory tier, the disk tier or the object store reaches
//! an [`EventSink`]. The server turns these into KV events in vLLM's wire
//! format for cache-aware routers (`docs/events.md`).
//!
//! The local tiers report from their chain index (its insert and its one
//! removal path: eviction, delete, expiry and replacement all go through it),
//! so no path that changes residency can forget to report. The object store
//! has no index here; [`ObservedTier`] wraps it and reports the puts and
//! deletes that succeeded.
use crate::block::{Block, BlockId};
use crate::error::Result;
use crate::keys::Key;
use crate::tier::{PutOutcome, Tier, TierKind, TierStats};
use async_trait::async_trait;
use std::sync::Arc;

/// The tiers a KV event names (`medium` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// The memory tier ("CPU").
    Memory,
    /// The disk tier ("DISK").
    Disk,
    /// The shared object store ("STORAGE").
    Object,
}

/// Receives residency changes. Called under a tier's lock: an
/// implementation only queues the change (it must not block or call back
/// into the engine).
pub trait EventSink: Send + Sync + 'static {
    /// `id` (whose chain parent is `parent`, given when `stored`) is now
    /// resident in `medium` (`stored`), or left it.
    fn change(&self, medium: Medium, stored: bool, id: &BlockId, parent: Option<&Key>);

    /// The token ids of `id`, reported before the `change` that stores it
    /// when its tier kept them (the disk tier's records at a warm restart).
    fn tokens(&self, _id: &BlockId, _tokens: Arc<[u32]>) {}
}

/// The chain-index observer reporting to `sink` as `medium`.
pub(crate) fn observer(sink: Arc<dyn EventSink>, medium: Medium) -> crate::chain_index::Observer {
    Arc::new(move |stored, id, parent| sink.change(medium, stored, id, parent))
}

/// An object-store tier that reports its successful puts and deletes.
pub(crate) struct ObservedTier {
    pub inner: Arc<dyn Tier>,
    pub sink: Arc<dyn EventSink>,
}

#[async_trait]
impl Tier for ObservedTier {
    fn kind(&self) -> TierKind {
        self.inner.kind()
    }
    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        self.inner.get(id).await
    }
    async fn contains(&self, id: &BlockId) -> Result<bool> {
        self.inner.contains(id).await
    }
    async fn put(&self, block: Block) -> Result<PutOutcome> {
        let (id, parent) = (block.meta.id.clone(), block.meta.parent.clone());
        let out = self.inner.put(block).await?;
        // `Existing` too: a consumer that missed the first writer's
        // announcement learns of the block here.
        self.sink.change(Medium::Object, true, &id, parent.as_ref());
        Ok(out)
    }
    async fn delete(&self, id: &BlockId) -> Result<u64> {
        let n = self.inner.delete(id).await?;
        self.sink.change(Medium::Object, false, id, None);
        Ok(n)
    }
    fn stats(&self) -> TierStats {
        self.inner.stats()
    }
    fn extra_counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.inner.extra_counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Namespace;
    use crate::memory::MemoryTier;
    use bytes::Bytes;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<(Medium, bool, Vec<u8>)>>);
    impl EventSink for Log {
        fn change(&self, m: Medium, stored: bool, id: &BlockId, _: Option<&Key>) {
            self.0.lock().push((m, stored, id.key.as_bytes().to_vec()));
        }
    }

    fn block(k: &[u8], parent: Option<&[u8]>, len: usize) -> Block {
        let ns = Namespace::new("t").unwrap();
        Block::new(
            BlockId::new(ns, Key::new(k.to_vec()).unwrap()),
            parent.map(|p| Key::new(p.to_vec()).unwrap()),
            16,
            Bytes::from(vec![7u8; len]),
        )
    }

    #[test]
    fn memory_reports_each_store_and_eviction_once() {
        let log = Arc::new(Log::default());
        let mem = MemoryTier::new(3 * 1024);
        mem.observe(observer(log.clone(), Medium::Memory));
        mem.put_block(block(b"a", None, 1000), crate::tier::Overwrite::Never)
            .unwrap();
        mem.put_block(block(b"b", Some(b"a"), 1000), crate::tier::Overwrite::Never)
            .unwrap();
        // Re-writing a resident block changes nothing and reports nothing.
        mem.put_block(block(b"b", Some(b"a"), 1000), crate::tier::Overwrite::Never)
            .unwrap();
        // A third block does not fit: it goes in, then the least recently
        // used leaf, the chain's tail "b", goes out.
        mem.put_block(block(b"c", None, 1000), crate::tier::Overwrite::Never)
            .unwrap();
        let got = log.0.lock().clone();
        let want = vec![
            (Medium::Memory, true, b"a".to_vec()),
            (Medium::Memory, true, b"b".to_vec()),
            (Medium::Memory, true, b"c".to_vec()),
            (Medium::Memory, false, b"b".to_vec()),
        ];
        assert_eq!(got, want);
    }
}
