//! The crate's unsafe code, each use with the reason it is sound: mapping
//! and unmapping memory, slices of a mapping, descriptors adopted from a
//! received message.
#![allow(unsafe_code)]

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use std::num::NonZeroUsize;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// A shared mapping of a whole file, unmapped on drop.
pub(crate) struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

// The mapping is plain memory: sharing its address between threads is
// sound; what each thread may do with it is decided by the owners of its
// ranges (the arena's slots hand out disjoint ranges).
unsafe impl Send for Map {}
unsafe impl Sync for Map {}

impl Map {
    /// Maps `len` bytes of `fd` shared, faulted in now (`MAP_POPULATE`):
    /// read-write or read-only.
    pub(crate) fn new(fd: BorrowedFd<'_>, len: usize, writable: bool) -> std::io::Result<Self> {
        let n = NonZeroUsize::new(len).ok_or(std::io::ErrorKind::InvalidInput)?;
        let prot = if writable {
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
        } else {
            ProtFlags::PROT_READ
        };
        // SAFETY: a fresh mapping at an address the kernel chooses aliases
        // nothing of this process; the file is at least `len` long (the
        // callers checked, and sealed files cannot shrink).
        let p = unsafe {
            mmap(
                None,
                n,
                prot,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd,
                0,
            )
        }?;
        Ok(Self { ptr: p.cast(), len })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes at `off..off + len`, read-only.
    ///
    /// Sound where nothing writes the range while the slice lives: the
    /// server's slots are written only before they are frozen, and a
    /// client's read-only mapping is of sealed memory only the server
    /// writes, into ranges it has not leased.
    pub(crate) fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (asserted); see above for aliasing.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// The bytes at `off..off + len`, writable. The caller owns the range
    /// exclusively (an arena slot not yet frozen, a lent segment's range
    /// this process fills).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn slice_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds; exclusive per the caller's ownership of the range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }

    /// Copies `dst.len()` bytes at `off` into `dst` without forming a
    /// reference to memory another process may be writing (a lent segment).
    pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) {
        assert!(off.checked_add(dst.len()).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds; `dst` is ours and cannot overlap a mapping
        // created by this type.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made; no slice outlives `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// Takes ownership of descriptors the kernel installed in this process for
/// a received `SCM_RIGHTS` message.
pub(crate) fn adopt(fds: &[RawFd]) -> Vec<OwnedFd> {
    // SAFETY: each was just installed by recvmsg and is owned by nobody else.
    fds.iter()
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}
