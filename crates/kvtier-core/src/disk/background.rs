//! The disk tier's background thread: the `Batch` flusher and the unlink queue.
//!
//! * Under [`SyncMode::Batch`](super::SyncMode::Batch) every write leaves its
//!   open file and its shard directory here; the thread wakes every
//!   `batch_interval`, `fdatasync`s the files and `fsync`s the directories.
//! * Records removed from the index by TTL purges are unlinked here, so that
//!   `Engine::purge_expired` (a synchronous call) never does file I/O.
//!
//! On shutdown (the tier is dropped) the thread drains both queues once more.
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Default)]
struct Queues {
    dirty_files: Vec<File>,
    dirty_dirs: BTreeSet<PathBuf>,
    unlink: Vec<PathBuf>,
    shutdown: bool,
}

/// Work shared between the tier and its background thread.
#[derive(Default)]
pub(crate) struct Background {
    q: Mutex<Queues>,
    cv: Condvar,
}

impl Background {
    /// Queues a written file and its directory for the next batch flush.
    pub fn dirty(&self, file: File, dir: PathBuf) {
        let mut q = self.q.lock();
        q.dirty_files.push(file);
        q.dirty_dirs.insert(dir);
    }

    /// Queues files to unlink and wakes the thread.
    pub fn unlink(&self, paths: Vec<PathBuf>) {
        if paths.is_empty() {
            return;
        }
        self.q.lock().unlink.extend(paths);
        self.cv.notify_one();
    }

    /// Files waiting to be unlinked.
    pub fn pending_unlinks(&self) -> usize {
        self.q.lock().unlink.len()
    }

    /// Asks the thread to drain and exit.
    pub fn shutdown(&self) {
        self.q.lock().shutdown = true;
        self.cv.notify_one();
    }

    /// The thread body. `interval` is `Some` in batch mode.
    pub fn run(self: Arc<Self>, interval: Option<Duration>) {
        loop {
            let (files, dirs, unlink, stop) = {
                let mut q = self.q.lock();
                if !q.shutdown && q.unlink.is_empty() {
                    match interval {
                        Some(d) => {
                            self.cv.wait_for(&mut q, d);
                        }
                        None => self.cv.wait(&mut q),
                    }
                }
                (
                    std::mem::take(&mut q.dirty_files),
                    std::mem::take(&mut q.dirty_dirs),
                    std::mem::take(&mut q.unlink),
                    q.shutdown,
                )
            };
            for f in &files {
                if let Err(e) = f.sync_data() {
                    tracing::warn!(error = %e, "disk tier: batch fdatasync failed");
                }
            }
            for d in &dirs {
                if let Err(e) = File::open(d).and_then(|f| f.sync_all()) {
                    tracing::warn!(dir = %d.display(), error = %e, "disk tier: batch directory fsync failed");
                }
            }
            for p in &unlink {
                if let Err(e) = std::fs::remove_file(p)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(path = %p.display(), error = %e, "disk tier: unlink failed");
                }
            }
            if stop {
                let q = self.q.lock();
                if q.dirty_files.is_empty() && q.unlink.is_empty() {
                    return;
                }
            }
        }
    }
}
