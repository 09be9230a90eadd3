//! Payload buffers whose pages the kernel may borrow (notes/039).
//!
//! A data-plane server can send a stored block without copying it into the
//! socket: `vmsplice(2)` hands the block's pages to a pipe and `splice(2)`
//! moves them into the socket, so the socket's buffers *refer to* the
//! block's memory instead of holding a copy. The reader then copies straight
//! out of those pages (on loopback), or the NIC reads them.
//!
//! The kernel may hold such a reference for as long as the reader likes: a
//! slow or malicious client that never reads keeps it in its receive queue,
//! and nothing tells the sender when it is gone. If the block were later
//! evicted and its memory handed to another block (another tenant's), that
//! client would read the new bytes. So memory that was ever lent is never
//! reused as it is: when a [`Pages`] buffer that was lent is freed, its pages
//! are first given back to the kernel with `madvise(MADV_DONTNEED)`. The
//! kernel keeps the old physical pages, with their contents, for as long as a
//! socket refers to them; the process's next use of those addresses gets
//! fresh, zeroed pages. No reference to freed memory can ever show new data.
//!
//! Only memory allocated here can be lent, and only whole: a [`Pages`] buffer
//! is page-aligned and a whole number of pages long, so no other allocation
//! shares a page with it (a lent page of a general heap allocation could be
//! rewritten by its neighbour). [`lend`] finds a payload's buffer in a
//! registry of live buffers and refuses anything not inside one (a block that
//! arrived over gRPC, or from disk, is written as before).
//!
//! The price is paid once per lent buffer, when its memory is next used:
//! page faults and zeroing instead of reusing mapped pages (measured in
//! notes/039).
use bytes::Bytes;
use std::alloc::{Layout, alloc, dealloc};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Payloads shorter than this are not lent (nor allocated as [`Pages`]): the
/// page rounding would waste too much, and for small payloads the pinning
/// and the extra system calls cost more than the copy they save.
pub const LEND_MIN: usize = 64 * 1024;

/// Live [`Pages`] buffers: start address → (end address, lent).
static LIVE: Mutex<BTreeMap<usize, (usize, bool)>> = Mutex::new(BTreeMap::new());
static RETIRED: AtomicU64 = AtomicU64::new(0);

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, (usize, bool)>> {
    // The map is consistent after every statement: a panic elsewhere while
    // it was held leaves nothing half-done.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes of lent buffers given back to the kernel on being freed, since the
/// process started (metrics: `kvtier_wire_retired_bytes_total`).
pub fn retired_bytes() -> u64 {
    RETIRED.load(Ordering::Relaxed)
}

fn page_size() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|s| usize::try_from(s).ok())
            .filter(|s| s.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// A page-aligned buffer, a whole number of pages long, filled front to back.
/// Freeze it into [`Bytes`] with [`Pages::freeze`]; slices of those bytes
/// may then be [`lend`]t.
pub struct Pages {
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
}

// SAFETY: `Pages` owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for Pages {}
// SAFETY: shared access is read-only (`AsRef<[u8]>`).
unsafe impl Sync for Pages {}

impl Pages {
    /// An empty buffer with room for at least `n` bytes (`n` > 0).
    pub fn with_capacity(n: usize) -> Pages {
        let page = page_size();
        let cap = n.max(1).div_ceil(page) * page;
        let layout = Layout::from_size_align(cap, page).expect("a page-aligned layout");
        // SAFETY: the layout's size is non-zero.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        live().insert(ptr.as_ptr() as usize, (ptr.as_ptr() as usize + cap, false));
        Pages {
            ptr,
            layout,
            len: 0,
        }
    }

    /// The bytes written so far.
    pub fn filled(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were initialised (`advance`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The room after the bytes written so far.
    pub fn spare(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: in bounds of the allocation; `MaybeUninit` needs no initialisation.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.as_ptr().add(self.len).cast(),
                self.layout.size() - self.len,
            )
        }
    }

    /// Marks `n` more bytes, at the start of [`Pages::spare`], as written.
    ///
    /// # Safety
    /// Those bytes must have been initialised.
    pub unsafe fn advance(&mut self, n: usize) {
        assert!(n <= self.layout.size() - self.len, "advance past the end");
        self.len += n;
    }

    /// The bytes written, as `Bytes` that own this buffer.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }

    /// Gives the pages back to the kernel (module docs); false when it
    /// refused, and the memory must then never be reused.
    fn retire(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: the range is this buffer's own, page-aligned allocation;
            // it reads as zeroes afterwards, which the allocator tolerates.
            let r = unsafe {
                nix::sys::mman::madvise(
                    self.ptr.cast(),
                    self.layout.size(),
                    nix::sys::mman::MmapAdvise::MADV_DONTNEED,
                )
            };
            if let Err(e) = r {
                tracing::error!(error = %e, bytes = self.layout.size(),
                    "madvise(MADV_DONTNEED) refused on a lent buffer; its memory is leaked rather than reused");
                return false;
            }
        }
        RETIRED.fetch_add(self.layout.size() as u64, Ordering::Relaxed);
        true
    }
}

impl AsRef<[u8]> for Pages {
    fn as_ref(&self) -> &[u8] {
        self.filled()
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        let lent = live()
            .remove(&(self.ptr.as_ptr() as usize))
            .is_some_and(|(_, lent)| lent);
        if lent && !self.retire() {
            return; // leaked: see `retire`
        }
        // SAFETY: allocated in `with_capacity` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Whether `payload` may be handed to the kernel by reference: true when it
/// lies inside a live [`Pages`] buffer (which is then marked so that its
/// memory is given back to the kernel, not reused, when it is freed) and is
/// at least [`LEND_MIN`] long. The caller holds `payload` while it lends it,
/// so the buffer cannot be freed in between.
pub fn lend(payload: &[u8]) -> bool {
    if !cfg!(target_os = "linux") || payload.len() < LEND_MIN {
        return false;
    }
    let start = payload.as_ptr() as usize;
    let end = start + payload.len();
    let mut live = live();
    match live.range_mut(..=start).next_back() {
        Some((_, (buf_end, lent))) if end <= *buf_end => {
            *lent = true;
            true
        }
        _ => false,
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use nix::fcntl::{SpliceFFlags, vmsplice};
    use std::io::Read;

    fn filled(n: usize, byte: u8) -> Pages {
        let mut p = Pages::with_capacity(n);
        for b in &mut p.spare()[..n] {
            b.write(byte);
        }
        // SAFETY: just written.
        unsafe { p.advance(n) };
        p
    }

    #[test]
    fn buffers_are_whole_pages_and_only_their_bytes_are_lendable() {
        let page = page_size();
        let p = filled(LEND_MIN + 10, 7).freeze();
        assert_eq!(p.as_ptr() as usize % page, 0, "page-aligned");
        assert_eq!(p.len(), LEND_MIN + 10);
        assert!(lend(&p));
        assert!(lend(&p.slice(5..LEND_MIN + 5)), "a slice inside the buffer");
        assert!(!lend(&p.slice(..LEND_MIN - 1)), "below LEND_MIN");
        // Memory that is not a `Pages` buffer is never lent.
        let heap = vec![1u8; 4 * LEND_MIN];
        assert!(!lend(&heap));
        assert!(!lend(&Bytes::from(vec![2u8; 4 * LEND_MIN])));
        drop(p);
    }

    /// The property the module exists for: bytes a pipe (and so a socket)
    /// took by reference stay what they were after the buffer is freed and
    /// its addresses are written again. Without the `MADV_DONTNEED` in
    /// `retire`, the pipe shows the new bytes.
    #[test]
    fn lent_pages_keep_their_bytes_after_the_memory_is_rewritten() {
        let n = 256 * 1024;
        let p = filled(n, b'A');
        let (rd, wr) = nix::unistd::pipe().unwrap();
        nix::fcntl::fcntl(&wr, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20)).unwrap();
        assert!(lend(p.filled()));
        let mut put = 0;
        while put < n {
            put += vmsplice(
                &wr,
                &[std::io::IoSlice::new(&p.filled()[put..])],
                SpliceFFlags::empty(),
            )
            .unwrap();
        }
        // What freeing does, short of giving the memory to the allocator, so
        // the test can write the same addresses again as their next owner.
        let before = retired_bytes();
        assert!(p.retire());
        assert!(retired_bytes() >= before + n as u64);
        // SAFETY: `p` owns the allocation and nothing borrows it.
        unsafe { std::ptr::write_bytes(p.ptr.as_ptr(), b'B', n) };
        assert_eq!(p.filled()[0], b'B');
        let mut got = vec![0u8; n];
        std::fs::File::from(rd).read_exact(&mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == b'A'),
            "the pipe shows bytes written after the buffer was retired ({} of {n} changed)",
            got.iter().filter(|&&b| b != b'A').count()
        );
        drop(wr);
    }

    #[test]
    fn freed_buffers_leave_the_registry() {
        let p = filled(LEND_MIN, 1).freeze();
        let at = p.as_ptr() as usize;
        assert!(live().contains_key(&at));
        let q = p.clone();
        drop(p);
        assert!(live().contains_key(&at), "a clone keeps it alive");
        drop(q);
        // Another buffer may have taken the address since; the old entry is gone.
        assert!(live().get(&at).is_none_or(|&(_, lent)| !lent));
    }
}
