//! What a client can do with the descriptors it is handed (docs/security.md,
//! "Shared memory"): each check plays the client that tries to change the
//! server's memory, and fails without the seal it checks.
#![allow(unsafe_code)]

use kvtier_shm::{Arena, Budget, Mapping, Segment, Sharing};
use nix::fcntl::{OFlag, open};
use nix::sys::mman::{MapFlags, ProtFlags, mmap};
use nix::sys::stat::Mode;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd};

fn writable_map(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> nix::Result<()> {
    // SAFETY: a fresh mapping the kernel places; unmapped never (the test exits).
    unsafe {
        mmap(
            None,
            NonZeroUsize::new(len).unwrap(),
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            fd,
            0,
        )
    }
    .map(drop)
}

#[test]
fn a_tier_segments_descriptor_cannot_write_shrink_or_grow_it() {
    let a = Arena::new("t", 4 << 20, Budget::new(4 << 20));
    let mut s = a.alloc(4096).unwrap();
    s.bytes_mut().fill(0x5a);
    let seg = s.segment().clone();
    let b = s.freeze();
    let fd = seg.share().unwrap();
    // Read-only descriptor: no writable shared mapping, no write(2).
    assert!(writable_map(fd.as_fd(), 4096).is_err());
    assert!(nix::unistd::write(&fd, b"x").is_err());
    // Reopened read-write through /proc: the seals still refuse writes.
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let rw = open(path.as_str(), OFlag::O_RDWR, Mode::empty()).expect("memfds reopen read-write");
    assert_eq!(
        writable_map(rw.as_fd(), 4096).unwrap_err(),
        nix::errno::Errno::EPERM,
        "F_SEAL_FUTURE_WRITE refuses new writable mappings"
    );
    assert!(nix::unistd::write(&rw, b"x").is_err());
    assert!(nix::unistd::ftruncate(&rw, 0).is_err(), "F_SEAL_SHRINK");
    assert!(nix::unistd::ftruncate(&rw, 1 << 30).is_err(), "F_SEAL_GROW");
    assert!(
        b.iter().all(|&x| x == 0x5a),
        "the server's bytes are unchanged"
    );
    // And a client maps it read-only and sees them.
    let m = Mapping::new(seg.share().unwrap(), seg.len(), false).unwrap();
    assert!(m.get(0, 4096).unwrap().iter().all(|&x| x == 0x5a));
    assert!(
        m.get(seg.len() as u64 - 1, 2).is_none(),
        "reads past the end are refused"
    );
}

#[test]
fn a_lent_segment_can_be_written_but_not_shrunk() {
    let seg = Segment::create("lent", 1 << 20, Sharing::Lent).unwrap();
    let fd = seg.share().unwrap();
    assert!(
        nix::unistd::ftruncate(&fd, 4096).is_err(),
        "no SIGBUS for the server"
    );
    let m = Mapping::new(fd, seg.len(), true).unwrap();
    assert!(m.put(0, b"hello"));
    assert!(
        !m.put(seg.len() - 2, b"hello"),
        "writes past the end are refused"
    );
    let mut got = [0u8; 5];
    seg.copy_out(0, &mut got);
    assert_eq!(&got, b"hello");
}

#[test]
fn unsealed_memory_is_not_mapped_by_a_client() {
    let fd = nix::sys::memfd::memfd_create(c"plain", nix::sys::memfd::MFdFlags::empty()).unwrap();
    nix::unistd::ftruncate(&fd, 4096).unwrap();
    assert!(Mapping::new(fd, 4096, false).is_err());
}
