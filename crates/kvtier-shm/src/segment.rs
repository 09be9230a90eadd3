//! A segment: a `memfd` the server creates, maps read-write and faults in
//! once, then seals, so that what a client can do with its descriptor is
//! fixed before the client ever sees it.
//!
//! * Every segment is sealed against shrinking and growing
//!   (`F_SEAL_SHRINK | F_SEAL_GROW`), then against further seals: no holder
//!   of the descriptor can truncate it under the server's mapping (a
//!   SIGBUS in the server) or make it larger than it was faulted in.
//! * A tier segment ([`Sharing::ReadOnly`]) is also sealed
//!   `F_SEAL_FUTURE_WRITE`: the server's own mapping stays writable, and no
//!   new writable mapping, `write(2)` or hole punch can be made by anyone,
//!   through this descriptor or any reopening of it. The descriptor clients
//!   get is moreover opened read-only.
//! * A lent segment ([`Sharing::Lent`]) is written by the one client it is
//!   lent to; the server only copies out of it (docs/local.md, "Saves").
use crate::sys::Map;
use nix::fcntl::{FcntlArg, OFlag, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::stat::Mode;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Segment ids, unique in this process for its whole life, and starting at
/// a different place in each (the clock at the first segment, shifted), so
/// that a client which keeps something per segment id (a GPU registration of
/// its mapping) does not take a restarted server's segment for an old one.
static NEXT_ID: std::sync::OnceLock<AtomicU64> = std::sync::OnceLock::new();

fn next_id() -> u64 {
    NEXT_ID
        .get_or_init(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            AtomicU64::new((now << 16).max(1))
        })
        .fetch_add(1, Ordering::Relaxed)
}

/// Who may write a segment once it is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Only the server (the tier's blocks): clients map it read-only.
    ReadOnly,
    /// The one client it is lent to, which fills it for a save.
    Lent,
}

/// A sealed, faulted-in `memfd` and the server's read-write mapping of it.
pub struct Segment {
    id: u64,
    fd: OwnedFd,
    map: Map,
    sharing: Sharing,
}

impl Segment {
    /// A segment of `len` bytes (rounded up to the page size), faulted in
    /// and sealed for `sharing`. `name` shows in `/proc/PID/maps`.
    pub fn create(name: &str, len: usize, sharing: Sharing) -> std::io::Result<Self> {
        let len = len.max(1).next_multiple_of(page());
        let cname = std::ffi::CString::new(format!("kvtier:{name}"))
            .map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let fd = memfd_create(
            cname.as_c_str(),
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        nix::unistd::ftruncate(&fd, len as i64)?;
        let map = Map::new(fd.as_fd(), len, true)?;
        let mut seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        if sharing == Sharing::ReadOnly {
            seals |= SealFlag::F_SEAL_FUTURE_WRITE;
        }
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals))?;
        Ok(Self {
            id: next_id(),
            fd,
            map,
            sharing,
        })
    }

    /// The segment's id (unique in this process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it has no bytes (never: segments are at least a page).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Who may write it.
    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// Whether `bytes` lie inside this segment's mapping; if so, their offset.
    pub fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        let base = self.map.addr() as usize;
        let p = bytes.as_ptr() as usize;
        (p >= base && p + bytes.len() <= base + self.map.len()).then(|| p - base)
    }

    /// The descriptor to hand a client: for a tier segment a new read-only
    /// open of the same file (`/proc/self/fd`; the seals guard it where
    /// `/proc` is not mounted), for a lent one the read-write descriptor.
    pub fn share(&self) -> std::io::Result<OwnedFd> {
        if self.sharing == Sharing::ReadOnly {
            let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
            if let Ok(fd) = nix::fcntl::open(
                path.as_str(),
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                return Ok(fd);
            }
        }
        self.fd.try_clone()
    }

    /// The server's own descriptor (tests inspect its seals).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn map(&self) -> &Map {
        &self.map
    }

    /// Copies `dst.len()` bytes at `off` out of the segment (a lent one,
    /// which its client may be writing meanwhile: the copy is what counts,
    /// and the caller checksums the copy, not the source).
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) {
        self.map.copy_out(off, dst)
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("id", &self.id)
            .field("len", &self.map.len())
            .field("sharing", &self.sharing)
            .finish()
    }
}

/// The page size mappings are rounded to.
pub fn page() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize)
}

/// The seals of a descriptor (tests, and clients checking what they map).
pub fn seals(fd: BorrowedFd<'_>) -> std::io::Result<SealFlag> {
    Ok(SealFlag::from_bits_truncate(fcntl(
        fd,
        FcntlArg::F_GET_SEALS,
    )?))
}
