//! Hands the allocator's freed pages back to the kernel while the process's
//! resident memory is above `server.resident_limit` (notes/024).
//!
//! jemalloc keeps the pages it has freed ("dirty") for `dirty_decay_ms`
//! (10 s) before returning them, so that the next allocation reuses them
//! without a page fault. Under steady eviction that reuse is much of the
//! write path's speed (notes/016), but what it keeps grows with the rate of
//! frees times the decay time, and no budget sees it. Shortening the decay
//! for every free halves writes (notes/014). Instead, the binary turns the
//! decay off (`malloc_conf` in main.rs; notes/025), and a watcher thread
//! reads the process's resident memory every [`INTERVAL`] and purges every
//! arena's dirty pages while it is within [`HEADROOM`] of the limit.
//!
//! The limit is a line for the whole process's RSS (docs/operations.md), so
//! the watcher reads the kernel's count (`VmRSS`: the heap, and also the
//! binary's pages, thread stacks and everything not from jemalloc), not
//! jemalloc's own `stats.resident`, which would let RSS sit above the line
//! by the size of everything else. It acts [`HEADROOM`] below the line
//! because it acts only every [`INTERVAL`]: a write flood grows the heap by
//! up to ~20 MB in one interval (1 GB/s), and that must still fit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tikv_jemalloc_ctl::{epoch, stats};

/// How often the watcher reads the allocator's statistics.
pub const INTERVAL: Duration = Duration::from_millis(20);

/// How far below the limit the watcher starts handing pages back (at most a
/// quarter of the limit).
pub const HEADROOM: u64 = 32 << 20;

static PURGES: AtomicU64 = AtomicU64::new(0);
/// The limit `start` was given, for the `kvtier_resident_limit_bytes` gauge.
static LIMIT: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicBool = AtomicBool::new(false);

/// Starts the watcher (it runs for the life of the process) and installs
/// the `kvtier_allocator_*` metrics.
pub fn start(limit: u64) -> anyhow::Result<()> {
    // Fail at start, not in the thread, if the statistics are unavailable.
    read().ok_or_else(|| anyhow::anyhow!("jemalloc statistics are unavailable"))?;
    LIMIT.store(limit, Ordering::Relaxed);
    kvtier_server::metrics::set_allocator_probe(probe);
    let threshold = limit - HEADROOM.min(limit / 4);
    std::thread::Builder::new()
        .name("kvtier-purge".into())
        .spawn(move || {
            loop {
                std::thread::sleep(INTERVAL);
                if let Some((_, heap)) = read()
                    && process_resident().unwrap_or(heap) > threshold
                {
                    if purge_all() {
                        PURGES.fetch_add(1, Ordering::Relaxed);
                    } else if !FAILED.swap(true, Ordering::Relaxed) {
                        // With decay off nothing else hands pages back: say so once.
                        tracing::warn!(
                            "jemalloc refused to purge freed pages; resident memory may stay above server.resident_limit"
                        );
                    }
                }
            }
        })?;
    Ok(())
}

/// The process's resident memory (`VmRSS`), if /proc can be read.
fn process_resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// jemalloc's (allocated, resident) bytes, refreshed.
fn read() -> Option<(u64, u64)> {
    epoch::advance().ok()?;
    Some((
        stats::allocated::read().ok()? as u64,
        stats::resident::read().ok()? as u64,
    ))
}

fn probe() -> kvtier_server::metrics::AllocatorStats {
    let (allocated, resident) = read().unwrap_or_default();
    kvtier_server::metrics::AllocatorStats {
        allocated,
        resident,
        purges: PURGES.load(Ordering::Relaxed),
        process_resident: process_resident(),
        resident_limit: LIMIT.load(Ordering::Relaxed),
        dirty_decay_ms: *DIRTY_DECAY_MS.get_or_init(dirty_decay_ms),
    }
}

/// `opt.dirty_decay_ms`, read once: options are fixed when jemalloc starts,
/// so a `/metrics` scrape need not call into it again.
static DIRTY_DECAY_MS: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();

/// jemalloc's `opt.dirty_decay_ms` (what `malloc_conf` in main.rs or
/// `_RJEM_MALLOC_CONF` set), if it can be read.
#[allow(unsafe_code)]
fn dirty_decay_ms() -> Option<i64> {
    // SAFETY: `opt.dirty_decay_ms` is a read-only `ssize_t` control, read
    // into a value of that exact type.
    unsafe { tikv_jemalloc_ctl::raw::read::<isize>(b"opt.dirty_decay_ms\0") }
        .ok()
        .map(|v| v as i64)
}

/// Purges the dirty pages of every arena (`MALLCTL_ARENAS_ALL` = 4096);
/// whether jemalloc did.
#[allow(unsafe_code)]
fn purge_all() -> bool {
    let name = b"arena.4096.purge\0";
    // SAFETY: a NUL-terminated control name, with null old/new pointers and
    // a zero length: how jemalloc's void controls are called (tikv-jemalloc-ctl
    // wraps none of them).
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0
}
