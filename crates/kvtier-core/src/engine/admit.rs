//! Admission to the lower tiers (`crate::admission`, docs/cache-choice.md):
//! what a write defers, and how a later use writes the block down.

use super::*;
use crate::admission::AdmissionStats;

impl Engine {
    /// Counts a write's use of `id` towards the disk tier's admission:
    /// true when the disk copy is deferred (the block stays in memory only).
    pub(super) fn defer_disk(&self, id: &BlockId, mode: Overwrite) -> bool {
        self.disk.is_some() && defers(&self.disk_admission, id, mode)
    }

    /// The same for the object store.
    pub(super) fn defer_object(&self, id: &BlockId, mode: Overwrite) -> bool {
        self.object.is_some() && defers(&self.object_admission, id, mode)
    }

    /// A block was used again (read from memory or disk, or written again):
    /// a policy that admits it now has it written down, in the background
    /// (the read does not wait; the write that deferred it was already
    /// answered as deferred).
    pub(super) fn used_again(&self, b: &Block) {
        let id = &b.meta.id;
        if let Some(disk) = &self.disk
            && self.disk_admission.policy() != Admission::All
            && self.disk_admission.record(id) == Decision::Admit
            && !disk.has(id)
        {
            let (disk, b, adm) = (disk.clone(), b.clone(), self.disk_admission.clone());
            tokio::spawn(async move {
                let len = b.payload.len() as u64;
                match disk.put_with(b, Overwrite::Never).await {
                    Ok(_) => adm.note_admitted(len),
                    Err(e) => {
                        tracing::warn!(error = %e, "an admitted block could not be written to disk")
                    }
                }
            });
        }
        if let Some(obj) = &self.object
            && self.object_admission.policy() != Admission::All
            && self.object_admission.record(id) == Decision::Admit
        {
            self.upload_admitted(obj, b.clone());
        }
    }

    /// Uploads a block the object store's admission just took: queued when
    /// the store is written back, else put at once; both in the background.
    pub(super) fn upload_admitted(&self, obj: &ObjectLink, b: Block) {
        let (adm, len) = (self.object_admission.clone(), b.payload.len() as u64);
        let done = move |r: Result<()>| match r {
            Ok(()) => adm.note_admitted(len),
            Err(e) => tracing::warn!(error = %e, "an admitted block could not be uploaded"),
        };
        match &obj.writeback {
            Some(wb) => {
                let (wb, budget) = (
                    wb.clone(),
                    crate::deadline::budget(obj.opts.enqueue_timeout),
                );
                tokio::spawn(async move { done(wb.enqueue(b, budget).await) });
            }
            None => {
                let tier = obj.tier.clone();
                tokio::spawn(async move { done(tier.put(b).await.map(|_| ())) });
            }
        }
    }

    /// Whether a block leaving memory may go down to disk; counts the ones
    /// that may not (never written anywhere).
    pub(super) fn may_demote(adm: &Admitter, id: &BlockId) -> bool {
        let ok = adm.admits(id);
        if !ok {
            adm.note_rejected();
        }
        ok
    }

    /// The admission policies of the disk tier and the object store, with
    /// their counters (`None` for a tier not configured).
    pub fn admission_stats(&self) -> Vec<(TierKind, Admission, AdmissionStats)> {
        let mut v = Vec::new();
        if self.disk.is_some() {
            let a = &self.disk_admission;
            v.push((TierKind::Disk, a.policy(), a.stats()));
        }
        if self.object.is_some() {
            let a = &self.object_admission;
            v.push((TierKind::Object, a.policy(), a.stats()));
        }
        v
    }
}

/// Counts a write's use of `id` under `adm`: true (and counted deferred)
/// when the policy does not admit the block yet. Values (replace
/// semantics) are always admitted.
fn defers(adm: &Admitter, id: &BlockId, mode: Overwrite) -> bool {
    if mode != Overwrite::Never || adm.policy() == Admission::All {
        return false;
    }
    let defer = !adm.record(id).admitted();
    if defer {
        adm.note_deferred();
    }
    defer
}
