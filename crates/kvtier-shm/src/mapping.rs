//! A client's mapping of a segment it received over the socket.
use crate::sys::Map;
use nix::fcntl::SealFlag;
use std::os::fd::{AsFd, OwnedFd};

/// A segment mapped into this process: read-only (the tier's blocks) or
/// read-write (a segment lent for a save).
pub struct Mapping {
    map: Map,
}

impl Mapping {
    /// Maps `fd`, which must be a sealed segment of at least `len` bytes
    /// (a descriptor that is not, from a server that is not kvtier, is
    /// refused rather than mapped: it could shrink under the mapping).
    pub fn new(fd: OwnedFd, len: usize, writable: bool) -> std::io::Result<Self> {
        let seals = crate::segment::seals(fd.as_fd())?;
        if !seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the server sent memory that is not sealed against shrinking",
            ));
        }
        let size = nix::sys::stat::fstat(&fd)?.st_size;
        if (size as u64) < len as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the server sent a segment of {size} bytes, announced as {len}"),
            ));
        }
        Ok(Self {
            map: Map::new(fd.as_fd(), len, writable)?,
        })
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Where it starts in this process (to register it with a GPU driver).
    pub fn addr(&self) -> usize {
        self.map.addr() as usize
    }

    /// The bytes at `off..off + len`, or `None` past its end. Sound for a
    /// read-only segment while the server holds a lease on the range (it
    /// writes only slots nobody holds).
    pub fn get(&self, off: u64, len: u64) -> Option<&[u8]> {
        let end = off.checked_add(len)?;
        (end <= self.map.len() as u64).then(|| self.map.slice(off as usize, len as usize))
    }

    /// Copies `src` into the mapping at `off` (a lent segment); false when
    /// it does not fit.
    pub fn put(&self, off: usize, src: &[u8]) -> bool {
        match off.checked_add(src.len()) {
            Some(end) if end <= self.map.len() => {
                self.map.slice_mut(off, src.len()).copy_from_slice(src);
                true
            }
            _ => false,
        }
    }
}
