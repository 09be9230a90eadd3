//! The write path: validation, the object-store write policy, memory with
//! demotion of what it evicts, the disk write-through or write-back, and
//! promotion of blocks read from below.

use super::*;

impl Engine {
    /// Validates and stores a block (immutable semantics).
    pub async fn write(&self, block: Block, timing: &mut StorageTiming) -> Result<WriteOutcome> {
        self.store(block, Overwrite::Never, timing).await
    }

    /// Stores a key/value entry, replacing any previous value.
    pub async fn put_value(
        &self,
        block: Block,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        self.store(block, Overwrite::Replace, timing).await
    }

    async fn store(
        &self,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        let before = timing.deferred;
        let r = match &self.peers {
            Some(peers) => self.store_in_cluster(peers, block, mode, timing).await,
            None => self.store_here(block, mode, timing).await,
        };
        // A block deferred by both lower tiers (or stored twice on this node
        // by the cluster's fallbacks) counts once.
        timing.deferred = timing.deferred.min(before + 1);
        r
    }

    /// Stores on this node: the object store per its policy, memory, disk.
    pub(super) async fn store_here(
        &self,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        match &self.object {
            None => self.store_local(block, mode, timing).await,
            Some(obj) => self.store_with_object(obj, block, mode, timing).await,
        }
    }

    /// Stores in the object store only (a cluster node that does not own
    /// the block): written through, or queued for write-back.
    pub(super) async fn store_object_only(
        &self,
        obj: &ObjectLink,
        block: Block,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        let fail = |e: Error| {
            obj.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            e
        };
        let t0 = Instant::now();
        let r = match obj.opts.policy {
            ObjectWritePolicy::WriteThrough => obj.tier.put(block).await,
            ObjectWritePolicy::WriteBack => {
                let wb = obj.writeback.as_ref().expect("write-back has a queue");
                wb.enqueue(block, crate::deadline::budget(obj.opts.enqueue_timeout))
                    .await
                    .map(|()| PutOutcome::Stored)
            }
        };
        timing.add(TierKind::Object, t0.elapsed());
        r.map_err(fail)
    }

    /// The object-store step around [`Engine::store_local`]; see `docs/object-store.md`.
    async fn store_with_object(
        &self,
        obj: &ObjectLink,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        self.check_size(block.payload.len())?;
        let id = block.meta.id.clone();
        let locally_known = self.held_locally(&id);
        if mode == Overwrite::Never && locally_known && !obj.is_enqueuing(&id) {
            // Already stored (and uploaded, queued, or deferred by admission)
            // or a conflict: local decides. A re-write is a use: a block the
            // store's admission deferred may be admitted now.
            let again = block.clone();
            let out = self.store_local(block, mode, timing).await?;
            if self.object_admission.policy() != Admission::All
                && self.object_admission.record(&id) == Decision::Admit
            {
                self.upload_admitted(obj, again);
            }
            return Ok(out);
        }
        if self.defer_object(&id, mode) {
            // Kept locally only until used again (docs/cache-choice.md).
            timing.deferred += 1;
            return self.store_local(block, mode, timing).await;
        }
        let fail = |e: Error| {
            obj.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            e
        };
        match obj.opts.policy {
            ObjectWritePolicy::WriteThrough => {
                // Durable in the store first: a failure leaves nothing behind.
                let t0 = Instant::now();
                let r = obj.tier.put(block.clone()).await;
                timing.add(TierKind::Object, t0.elapsed());
                r.map_err(fail)?;
                self.object_admission
                    .note_admitted(block.payload.len() as u64);
                self.store_local(block, mode, timing).await
            }
            ObjectWritePolicy::WriteBack => {
                let wb = obj.writeback.as_ref().expect("write-back has a queue");
                let group = obj.enqueuing(&id);
                let out = self.store_local(block.clone(), mode, timing).await?;
                if out == WriteOutcome::Stored {
                    group.stored();
                }
                let t0 = Instant::now();
                let len = block.payload.len() as u64;
                let r = wb
                    .enqueue(block, crate::deadline::budget(obj.opts.enqueue_timeout))
                    .await;
                if r.is_ok() {
                    self.object_admission.note_admitted(len);
                }
                timing.add(TierKind::Object, t0.elapsed());
                if let Err(e) = r {
                    // Not acknowledged, so not kept locally either, unless a
                    // concurrent writer of the same block was acknowledged
                    // or still may be (see `EnqueueGuard`).
                    if group.remove_on_failure() {
                        self.memory.remove(&id);
                        if let Some(d) = &self.disk {
                            let _ = d.delete(&id).await;
                        }
                    }
                    return Err(fail(e));
                }
                group.acked();
                Ok(out)
            }
        }
    }

    /// Copies a block read from the object store to the disk tier in the
    /// background (best effort; the read does not wait).
    pub(super) fn promote_to_disk(&self, b: &Block) {
        let (Some(disk), Some(obj)) = (&self.disk, &self.object) else {
            return;
        };
        if disk.has(&b.meta.id) {
            return;
        }
        // A read from the store is a use on this node (its first, here).
        if self.disk_admission.policy() != Admission::All
            && !self.disk_admission.record(&b.meta.id).admitted()
        {
            return;
        }
        let (disk, b, c) = (disk.clone(), b.clone(), obj.counters.clone());
        let adm = self.disk_admission.clone();
        tokio::spawn(async move {
            let len = b.payload.len() as u64;
            match disk.put_with(b, Overwrite::Never).await {
                Ok(_) => {
                    adm.note_admitted(len);
                    c.promotions_to_disk.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "promotion from the object store to disk failed")
                }
            }
        });
    }

    /// Stores in memory and (per the disk policy) on disk.
    pub(super) async fn store_local(
        &self,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        self.check_size(block.payload.len())?;
        // Under write-back every disk copy waits for eviction anyway, where
        // admission decides (`demote`).
        let defer =
            self.policy == WritePolicy::WriteThrough && self.defer_disk(&block.meta.id, mode);
        // Registered before the memory step, so a concurrent eviction of this
        // block does not demote it while this write is putting it on disk.
        let _writing = (self.disk.is_some() && self.policy == WritePolicy::WriteThrough && !defer)
            .then(|| WritingGuard::new(&self.writing, &block.meta.id));
        let t0 = Instant::now();
        let r = self.memory.put_block_evicting(block.clone(), mode);
        timing.add(TierKind::Memory, t0.elapsed());
        let Some(disk) = &self.disk else {
            return Ok(r?.0);
        };
        let (mem, evicted) = match r {
            Ok((o, ev)) => (Some(o), ev),
            // No room in memory (chain longer than memory, or pinned): the
            // block can still live on disk.
            Err(e) if e.kind == ErrorKind::ResourceExhausted => (None, Vec::new()),
            Err(e) => return Err(e),
        };
        let result = match (self.policy, mem) {
            (WritePolicy::WriteBack, Some(o)) => Ok(o),
            // Kept in memory only until used again; leaves it unwritten if
            // evicted first (docs/cache-choice.md).
            (_, Some(o)) if defer => {
                timing.deferred += 1;
                Ok(o)
            }
            // Identical block already in memory and on disk: nothing to write.
            (_, Some(PutOutcome::Existing)) if disk.has(&block.meta.id) => Ok(PutOutcome::Existing),
            _ => {
                let (id, len) = (block.meta.id.clone(), block.payload.len() as u64);
                let t0 = Instant::now();
                let d = disk.put_with(block, mode).await;
                timing.add(TierKind::Disk, t0.elapsed());
                match (d, mem) {
                    (Ok(o), _) => {
                        if o == PutOutcome::Stored {
                            self.disk_admission.note_admitted(len);
                        }
                        Ok(o)
                    }
                    (Err(e), Some(o)) if disk.config().sync != SyncMode::Always => {
                        self.counters
                            .degraded_writes
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(key = ?id.key, namespace = %id.namespace, error = %e,
                            "disk tier refused a write; kept in memory only");
                        Ok(o)
                    }
                    (Err(e), mem) => {
                        // Not acknowledged, so not kept: drop the copy memory just took.
                        if mem == Some(PutOutcome::Stored) {
                            self.memory.remove(&id);
                        }
                        Err(e)
                    }
                }
            }
        };
        self.demote(evicted, timing).await;
        result
    }

    /// Writes blocks evicted from memory to the disk tier unless it holds them
    /// already (under write-through it normally does). Best effort: failures
    /// are counted and logged.
    ///
    /// Runs in a task of its own, awaited here: the blocks have already left
    /// memory, and under write-back the disk copy is the only one. A caller
    /// that is dropped half way (a client's gRPC deadline, a read's timeout)
    /// must not leave the rest of them written nowhere.
    pub(super) async fn demote(&self, evicted: Vec<Block>, timing: &mut StorageTiming) {
        let Some(disk) = &self.disk else { return };
        if evicted.is_empty() {
            return;
        }
        let (disk, writing, counters) = (disk.clone(), self.writing.clone(), self.counters.clone());
        let admission = self.disk_admission.clone();
        let task = tokio::spawn(async move {
            let mut spent = std::time::Duration::ZERO;
            let now = crate::clock::unix_ms();
            for b in evicted {
                // `writing` before `has`: a write-through that is no longer in
                // flight has committed (or failed), so `has` is then current.
                if b.expired_at(now)
                    || writing.lock().contains_key(&b.meta.id)
                    || disk.has(&b.meta.id)
                    || !Engine::may_demote(&admission, &b.meta.id)
                {
                    continue;
                }
                let t0 = Instant::now();
                let len = b.payload.len() as u64;
                let r = disk.put_with(b, Overwrite::Never).await;
                spent += t0.elapsed();
                match r {
                    Ok(_) => {
                        admission.note_admitted(len);
                        counters.demotions.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "demotion to the disk tier failed; block dropped");
                        counters.demotion_failures.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            spent
        });
        match task.await {
            Ok(spent) => timing.add(TierKind::Disk, spent),
            Err(e) => tracing::error!(error = %e, "demotion task failed"),
        }
    }
}

/// Marks a block as being written through to disk for its lifetime.
pub(super) struct WritingGuard<'a> {
    set: &'a parking_lot::Mutex<std::collections::HashMap<BlockId, usize>>,
    id: BlockId,
}

impl<'a> WritingGuard<'a> {
    pub(super) fn new(
        set: &'a parking_lot::Mutex<std::collections::HashMap<BlockId, usize>>,
        id: &BlockId,
    ) -> Self {
        *set.lock().entry(id.clone()).or_default() += 1;
        Self {
            set,
            id: id.clone(),
        }
    }
}

impl Drop for WritingGuard<'_> {
    fn drop(&mut self) {
        let mut set = self.set.lock();
        if let Some(n) = set.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                set.remove(&self.id);
            }
        }
    }
}
