//! The disk tier's write, read and delete paths (blocking; run on
//! `spawn_blocking` or the background thread, never on the async runtime).
//!
//! A put reserves room in the index (evicting LRU leaves), writes the record
//! to a temp file, syncs it per [`SyncMode`], renames it into place and only
//! then commits it to the index. A get reads the whole file outside the lock
//! and verifies header and payload checksum before returning anything.
use super::background::Background;
use super::format;
use super::index::{Entry, Index, Lookup, Removed};
use super::{ALLOC_UNIT, DiskConfig, RecoveryReport, SyncMode};
use crate::block::{Block, BlockId, BlockMeta};
use crate::clock::unix_ms;
use crate::error::{Error, ErrorKind, Result};
use crate::tier::Overwrite;
use crate::tier::PutOutcome;
use bytes::Bytes;
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

/// State shared by the tier handle, its blocking tasks and its background thread.
pub(super) struct Shared {
    pub(super) cfg: DiskConfig,
    pub(super) blocks_dir: PathBuf,
    pub(super) index: Mutex<Index>,
    pub(super) next_seq: AtomicU64,
    pub(super) bg: Arc<Background>,
    pub(super) report: RecoveryReport,
    /// What `DiskTier::observe` announces with the records found at open.
    pub(super) recovered_tokens: Mutex<super::recovery::RecoveredTokens>,
    pub(super) corrupt_on_read: AtomicU64,
    pub(super) write_exhausted: AtomicU64,
    pub(super) write_errors: AtomicU64,
    /// Held for the tier's lifetime: `flock` on `<dir>/LOCK`.
    pub(super) _lock: File,
}

/// Bytes charged for a record of `len` bytes.
pub(super) fn charge(len: u64) -> u64 {
    len.div_ceil(ALLOC_UNIT).max(1) * ALLOC_UNIT
}

/// True for "no space" errors (ENOSPC, EDQUOT).
pub(crate) fn is_out_of_space(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull || matches!(e.raw_os_error(), Some(28) | Some(122))
}

/// Maps an I/O error during a write to the core error (`ResourceExhausted` for
/// a full device, `Internal` otherwise), naming the path.
pub(crate) fn write_error(what: &str, path: &Path, e: io::Error) -> Error {
    let err = if is_out_of_space(&e) {
        Error::exhausted(format!(
            "disk tier out of space: {what} {}: {e}; the block was not stored on disk",
            path.display()
        ))
    } else {
        Error::internal(format!("disk tier: {what} {}: {e}", path.display()))
    };
    err.with_source(e)
}

pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Shared {
    fn shard_dir(&self, hash: &[u8; 16]) -> PathBuf {
        self.blocks_dir.join(format!("{:02x}", hash[0]))
    }
    fn path(&self, hash: &[u8; 16], seq: u64, ext: &str) -> PathBuf {
        self.shard_dir(hash)
            .join(format!("{}-{seq:016x}.{ext}", hex::encode(hash)))
    }
    pub(super) fn record_path(&self, r: &Removed) -> PathBuf {
        self.path(&r.hash, r.seq, format::RECORD_EXT)
    }

    /// Unlinks removed records in order (descendants first). With `durable`
    /// under `Always`, also syncs their directories so the removal survives a
    /// crash (explicit deletes); evictions and replaced versions do not need
    /// that (a resurrected evicted record is still valid, and a replaced one
    /// loses to the newer sequence number on recovery).
    fn unlink_now(&self, removed: &[Removed], durable: bool) {
        let mut dirs = std::collections::BTreeSet::new();
        for r in removed {
            let p = self.record_path(r);
            if let Err(e) = std::fs::remove_file(&p)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(path = %p.display(), error = %e, "disk tier: unlink failed");
            }
            dirs.insert(self.shard_dir(&r.hash));
        }
        if durable && self.cfg.sync == SyncMode::Always {
            for d in dirs {
                if let Err(e) = sync_dir(&d) {
                    tracing::warn!(dir = %d.display(), error = %e, "disk tier: directory fsync failed");
                }
            }
        }
    }

    pub(super) fn unlink_later(&self, removed: &[Removed]) {
        self.bg
            .unlink(removed.iter().map(|r| self.record_path(r)).collect());
    }

    fn same(e: &Entry, meta: &BlockMeta, len: u64) -> bool {
        e.crc32c == meta.crc32c && e.payload_len == len && e.parent == meta.parent
    }

    pub(super) fn put(&self, block: Block, mode: Overwrite) -> Result<PutOutcome> {
        let id = block.meta.id.clone();
        let len = block.payload.len() as u64;
        let hash = format::file_hash(&id);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let header = format::encode_header_tokens(&block.meta, block.tokens.as_deref(), seq, len);
        let cost = charge(header.len() as u64 + len);
        let capacity = self.cfg.capacity.bytes();
        if cost > capacity {
            self.write_exhausted.fetch_add(1, Ordering::Relaxed);
            return Err(Error::exhausted(format!(
                "block of {len} bytes does not fit in the disk tier at {} ({capacity} bytes)",
                self.cfg.dir.display()
            )));
        }
        let parent = block
            .meta
            .parent
            .clone()
            .map(|p| BlockId::new(id.namespace.clone(), p));
        // Phase 1: check for an existing record and reserve room.
        let victims = {
            let mut idx = self.index.lock();
            let now_ms = unix_ms();
            let expired = idx.purge_expired(now_ms);
            self.unlink_later(&expired);
            let found = idx.lookup(&id, now_ms, true);
            if let Lookup::Expired(r) = &found {
                self.unlink_later(r);
            }
            if let Lookup::Live(e) = found {
                if Self::same(&e, &block.meta, len) {
                    return Ok(PutOutcome::Existing);
                }
                if mode == Overwrite::Never {
                    return Err(Error::precondition(format!(
                        "key {:?} already holds a different block; blocks are immutable",
                        id.key
                    )));
                }
            }
            let now = Instant::now();
            match idx.evict_for(cost, capacity, parent.as_ref(), Some(&id.namespace), now) {
                Ok(v) => {
                    idx.reserved += cost;
                    if let Some(p) = &parent {
                        idx.hold_parent(p);
                    }
                    v
                }
                Err(v) => {
                    let pinned = idx.pinned_bytes(now);
                    let (own, all) = (idx.group_bytes(&id.namespace), idx.bytes());
                    drop(idx);
                    self.unlink_now(&v, false);
                    self.write_exhausted.fetch_add(1, Ordering::Relaxed);
                    let why = if pinned > capacity / 2 {
                        format!("{pinned} of {capacity} bytes are pinned by leases")
                    } else if own < all {
                        format!(
                            "namespace {} is at its capacity share ({own} of {capacity} bytes; \
                             the rest is other tenants' share and this block's own ancestors \
                             or blocks being written, docs/security.md)",
                            id.namespace
                        )
                    } else {
                        "the rest of the tier holds this block's own ancestors or blocks being \
                         written (the chain is longer than the disk tier; raise --disk-capacity)"
                            .to_string()
                    };
                    return Err(Error::exhausted(format!(
                        "disk tier at {} full, block not stored: {why}",
                        self.cfg.dir.display()
                    )));
                }
            }
        };
        self.unlink_now(&victims, false);
        // Phase 2: write the record file.
        let written = self.write_record(&hash, seq, &header, &block.payload);
        // Phase 3: commit to the index.
        let mut idx = self.index.lock();
        idx.reserved -= cost;
        if let Some(p) = &parent {
            idx.release_parent(p);
        }
        if let Err(e) = written {
            drop(idx);
            if e.kind == ErrorKind::ResourceExhausted {
                self.write_exhausted.fetch_add(1, Ordering::Relaxed);
            } else {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
            }
            return Err(e);
        }
        let mine = Removed { hash, seq };
        let now_ms = unix_ms();
        let mut garbage = Vec::new();
        let outcome = match idx.lookup(&id, now_ms, false) {
            Lookup::Live(e) if Self::same(&e, &block.meta, len) => {
                // A concurrent identical write committed first; it is durable.
                garbage.push(mine);
                Ok(PutOutcome::Existing)
            }
            Lookup::Live(_) if mode == Overwrite::Never => {
                garbage.push(mine);
                Err(Error::precondition(format!(
                    "key {:?} already holds a different block; blocks are immutable",
                    id.key
                )))
            }
            found => {
                match found {
                    Lookup::Live(_) => garbage.extend(idx.remove_cascade(&id)),
                    Lookup::Expired(r) => garbage.extend(r),
                    Lookup::Missing => {}
                }
                let m = &block.meta;
                let entry = Entry::new(
                    seq,
                    hash,
                    cost,
                    m.crc32c,
                    len,
                    m.parent.clone(),
                    m.expires_unix_ms,
                );
                idx.insert(id, entry);
                Ok(PutOutcome::Stored)
            }
        };
        drop(idx);
        self.unlink_now(&garbage, false);
        outcome
    }

    /// Writes `<hash>-<seq>.tmp`, syncs per mode, renames it to `.kvb`.
    fn write_record(&self, hash: &[u8; 16], seq: u64, header: &[u8], payload: &[u8]) -> Result<()> {
        let tmp = self.path(hash, seq, format::TEMP_EXT);
        let dst = self.path(hash, seq, format::RECORD_EXT);
        let res = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(|e| write_error("creating", &tmp, e))?;
            f.write_all(header)
                .map_err(|e| write_error("writing", &tmp, e))?;
            f.write_all(payload)
                .map_err(|e| write_error("writing", &tmp, e))?;
            if self.cfg.sync == SyncMode::Always {
                f.sync_data()
                    .map_err(|e| write_error("fdatasync of", &tmp, e))?;
            }
            std::fs::rename(&tmp, &dst).map_err(|e| write_error("renaming", &tmp, e))?;
            Ok(f)
        })();
        let f = match res {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let dir = self.shard_dir(hash);
        match self.cfg.sync {
            SyncMode::Always => {
                if let Err(e) = sync_dir(&dir) {
                    let _ = std::fs::remove_file(&dst);
                    return Err(write_error("fsync of directory", &dir, e));
                }
            }
            SyncMode::Batch => self.bg.dirty(f, dir),
            SyncMode::Never => {}
        }
        Ok(())
    }

    pub(super) fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        let entry = {
            let mut idx = self.index.lock();
            match idx.lookup(id, unix_ms(), true) {
                Lookup::Live(e) => e,
                Lookup::Missing => {
                    idx.counters_mut().misses += 1;
                    return Ok(None);
                }
                Lookup::Expired(r) => {
                    idx.counters_mut().misses += 1;
                    drop(idx);
                    self.unlink_later(&r);
                    return Ok(None);
                }
            }
        };
        let path = self.path(&entry.hash, entry.seq, format::RECORD_EXT);
        let checked = match std::fs::read(&path) {
            Ok(buf) => verify_record(buf, id, &entry),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Evicted or deleted while we were reading, or removed behind
                // our back: then its descendants' files go too (the chain is
                // broken; left behind they would be outside the index's
                // accounting, and orphans after a restart).
                let removed = {
                    let mut idx = self.index.lock();
                    idx.counters_mut().misses += 1;
                    if idx.get(id).is_some_and(|e| e.seq == entry.seq) {
                        tracing::warn!(path = %path.display(), "disk tier: record file vanished; dropped from the index");
                        idx.remove_cascade(id)
                    } else {
                        Vec::new()
                    }
                };
                self.unlink_now(&removed, false);
                return Ok(None);
            }
            Err(e) => Err(format!("read failed: {e}")),
        };
        match checked {
            Ok(block) => {
                self.index.lock().counters_mut().hits += 1;
                Ok(Some(block))
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), key = ?id.key, namespace = %id.namespace, %why,
                    "disk tier: corrupt record removed; served as a miss");
                self.corrupt_on_read.fetch_add(1, Ordering::Relaxed);
                let removed = {
                    let mut idx = self.index.lock();
                    idx.counters_mut().misses += 1;
                    if idx.get(id).is_some_and(|e| e.seq == entry.seq) {
                        idx.remove_cascade(id)
                    } else {
                        Vec::new()
                    }
                };
                self.unlink_now(&removed, false);
                Ok(None)
            }
        }
    }

    pub(super) fn delete(&self, id: &BlockId) -> u64 {
        let removed = self.index.lock().remove_cascade(id);
        self.unlink_now(&removed, true);
        removed.len() as u64
    }
}

/// Verifies a record read for `id` against its index entry; returns the block.
fn verify_record(buf: Vec<u8>, id: &BlockId, entry: &Entry) -> std::result::Result<Block, String> {
    let h = format::decode_header(&buf).map_err(|e| format!("bad header: {e:?}"))?;
    if h.meta.id != *id || h.seq != entry.seq {
        return Err(format!(
            "header names {:?} seq {}, index expects seq {}",
            h.meta.id, h.seq, entry.seq
        ));
    }
    let total = h.header_len as u64 + h.payload_len;
    if buf.len() as u64 != total || h.payload_len != entry.payload_len {
        return Err(format!("file is {} bytes, header says {total}", buf.len()));
    }
    let payload = Bytes::from(buf).slice(h.header_len..);
    let crc = crc32c::crc32c(&payload);
    if crc != h.meta.crc32c || crc != entry.crc32c {
        return Err(format!(
            "payload crc32c {crc:#010x}, header says {:#010x}",
            h.meta.crc32c
        ));
    }
    Ok(Block {
        meta: h.meta,
        payload,
        tokens: h.tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_space_maps_to_resource_exhausted_naming_the_path() {
        for errno in [28, 122] {
            let e = write_error(
                "writing",
                Path::new("/d/x.tmp"),
                io::Error::from_raw_os_error(errno),
            );
            assert_eq!(e.kind, ErrorKind::ResourceExhausted);
            assert!(e.message.contains("/d/x.tmp"), "{}", e.message);
        }
        let e = write_error(
            "writing",
            Path::new("/d/x.tmp"),
            io::Error::from_raw_os_error(5),
        );
        assert_eq!(e.kind, ErrorKind::Internal);
        assert_eq!(charge(1), ALLOC_UNIT);
        assert_eq!(charge(ALLOC_UNIT + 1), 2 * ALLOC_UNIT);
    }
}
