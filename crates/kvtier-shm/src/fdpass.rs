//! Descriptors over the Unix socket (`SCM_RIGHTS`): a frame whose first
//! bytes carry the segments the reply names. Non-blocking, for tokio's
//! `async_io` (a `WouldBlock` means "wait for readiness and call again").
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Most descriptors one message carries (the kernel allows 253).
pub const MAX_FDS: usize = 64;

/// Sends as much of `bufs` as the socket takes, with `fds` attached to its
/// first byte; returns the bytes sent (the rest goes by ordinary writes).
pub fn send(
    sock: BorrowedFd<'_>,
    bufs: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors in one message (at most {MAX_FDS})",
                fds.len()
            ),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    Ok(sendmsg::<()>(
        sock.as_raw_fd(),
        bufs,
        cmsgs,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    )?)
}

/// Receives up to `buf.len()` bytes; descriptors that came with them are
/// appended to `fds` (close-on-exec). A message whose descriptors did not
/// all fit is an error (the ones that did are closed).
pub fn recv(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let n = msg.bytes;
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    let mut got = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(r) = c {
                got.extend(r);
            }
        }
    }
    let owned = crate::sys::adopt(&got);
    if truncated {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "more descriptors than one message may carry",
        ));
    }
    fds.extend(owned);
    Ok(n)
}
