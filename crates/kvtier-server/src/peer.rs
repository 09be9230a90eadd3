//! The process at the other end of a same-host connection, pinned at accept,
//! so that a memory copy (`wire::memory_copy`) only ever touches the process
//! that connected, and only while it still is what it was when it connected
//! (docs/security.md, "Threats and their guards").
//!
//! Why a pid is not enough: `SO_PEERCRED`'s pid is a number. It names the
//! process that called connect() even after that process exited, and then
//! possibly another process that was given the same number; a socket can be
//! handed to another process (fork, SCM_RIGHTS); and the process can exec a
//! setuid program, so the same live pid runs as someone else. So:
//!
//! - at accept the server takes a pidfd of the connecting process
//!   (`SO_PEERPIDFD`: the kernel holds the connecting process since
//!   connect(), so there is no window where the number names another one),
//!   and records its uids, gids and whether it is dumpable;
//! - before and after a request's copies, and (by one `stat`) before each
//!   block's, it checks through the pidfd that the process has not exited,
//!   reads `/proc/PID` and checks the pidfd again:
//!   while the pidfd's process lives, PID can name no other process, so what
//!   was read is that process's. The credentials read must equal those
//!   recorded at accept.
//!
//! A kernel without `SO_PEERPIDFD` (before Linux 6.5) gets no memory copies
//! at all: the client falls back to bytes over the socket.
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// Why the server will not copy into or out of the peer's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who a process is, as far as copying into its memory is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Creds {
    /// Real, effective, saved and filesystem uid (`/proc/PID/status`).
    uid: [u32; 4],
    /// The same four gids.
    gid: [u32; 4],
    /// The owner of `/proc/PID/status`: the effective uid and gid while the
    /// process is dumpable, root once it is not (a setuid exec,
    /// `PR_SET_DUMPABLE`). (`/proc/PID` itself keeps the effective ids.)
    dump_owner: (u32, u32),
}

/// The connecting process, pinned by a pidfd.
#[derive(Debug)]
pub struct Peer {
    pid: i32,
    pidfd: OwnedFd,
    creds: Creds,
}

impl Peer {
    /// Pins the process that connected `sock`, or says why its memory is
    /// out of reach.
    pub fn pin<F: AsFd>(sock: &F) -> Result<Peer, Refused> {
        let cred = getsockopt(sock, sockopt::PeerCredentials)
            .map_err(|e| Refused(format!("the peer's credentials are unknown ({e})")))?;
        let pidfd = getsockopt(sock, sockopt::PeerPidfd).map_err(|e| {
            Refused(format!(
                "the kernel gives no pidfd of the connecting process (SO_PEERPIDFD: {e}; \
                 Linux 6.5 or later), or it has exited"
            ))
        })?;
        let pid = pidfd_pid(&pidfd).ok_or_else(|| {
            Refused("the connecting process has exited or is outside this PID namespace".into())
        })?;
        if pid != cred.pid() {
            return Err(Refused(
                "the connecting process is outside this PID namespace".into(),
            ));
        }
        let mut peer = Peer {
            pid,
            pidfd,
            creds: Creds {
                uid: [0; 4],
                gid: [0; 4],
                dump_owner: (0, 0),
            },
        };
        peer.creds = peer.read_creds()?;
        let c = &peer.creds;
        if c.uid[1] != cred.uid() || c.gid[1] != cred.gid() {
            return Err(Refused(
                "the connecting process changed credentials since connect()".into(),
            ));
        }
        if c.dump_owner != (c.uid[1], c.gid[1]) {
            return Err(Refused(
                "the connecting process is not dumpable (setuid, setgid or PR_SET_DUMPABLE 0)"
                    .into(),
            ));
        }
        Ok(peer)
    }

    /// The peer's pid in this server's PID namespace, for process_vm_*;
    /// valid only between [`Peer::check`]s that pass.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.pid)
    }

    /// Whether the process that connected is still alive and still who it
    /// was at connect: the same uids and gids, still dumpable.
    pub fn check(&self) -> Result<(), Refused> {
        if self.read_creds()? != self.creds {
            return Err(changed());
        }
        Ok(())
    }

    /// [`Peer::check`] at the cost of one `stat`, for each block's copy:
    /// alive, the same effective uid and gid, still dumpable (what a setuid
    /// exec changes). The full check runs before and after a request's copies.
    pub fn check_quick(&self) -> Result<(), Refused> {
        let gone = || Refused("the connecting process has exited".into());
        if !self.alive() {
            return Err(gone());
        }
        let meta = std::fs::metadata(format!("/proc/{}/status", self.pid)).map_err(|_| gone())?;
        if !self.alive() {
            return Err(gone());
        }
        if (meta.uid(), meta.gid()) != self.creds.dump_owner {
            return Err(changed());
        }
        Ok(())
    }

    /// Whether the pidfd's process has not exited (a pidfd polls readable
    /// once it has).
    fn alive(&self) -> bool {
        let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
    }

    /// The process's credentials, read from `/proc/PID` between two checks
    /// that the pinned process is alive (so PID named it throughout).
    fn read_creds(&self) -> Result<Creds, Refused> {
        let gone = || Refused("the connecting process has exited".into());
        if !self.alive() {
            return Err(gone());
        }
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).map_err(|_| gone())?;
        let meta = std::fs::metadata(&path).map_err(|_| gone())?;
        if !self.alive() {
            return Err(gone());
        }
        let ids = |field: &str| -> Option<[u32; 4]> {
            let line = status.lines().find_map(|l| l.strip_prefix(field))?;
            let v: Vec<u32> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            v.try_into().ok()
        };
        let bad = || Refused("unreadable /proc status of the connecting process".into());
        Ok(Creds {
            uid: ids("Uid:").ok_or_else(bad)?,
            gid: ids("Gid:").ok_or_else(bad)?,
            dump_owner: (meta.uid(), meta.gid()),
        })
    }
}

fn changed() -> Refused {
    Refused(
        "the connecting process changed credentials or became undumpable since connect() \
         (an exec of a setuid program, setuid(), PR_SET_DUMPABLE)"
            .into(),
    )
}

/// The pid a pidfd names in this PID namespace (`Pid:` of its fdinfo): none
/// when the process has exited (-1) or is not visible from here (0).
fn pidfd_pid(fd: &OwnedFd) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let pid: i32 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()?;
    (pid > 0).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_peer_is_pinned_and_passes_its_checks() {
        // A socketpair's peer is this process.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let p = Peer::pin(&a).expect("pinned");
        assert_eq!(p.pid, std::process::id() as i32);
        assert_eq!(p.creds.uid[1], nix::unistd::geteuid().as_raw());
        p.check().expect("unchanged");
        // Credentials that differ from those recorded are refused.
        let other = Peer {
            creds: Creds {
                dump_owner: (p.creds.dump_owner.0 + 1, p.creds.dump_owner.1),
                ..p.creds.clone()
            },
            pidfd: p.pidfd.try_clone().unwrap(),
            pid: p.pid,
        };
        assert!(other.check().unwrap_err().0.contains("undumpable"));
        assert!(other.check_quick().unwrap_err().0.contains("undumpable"));
        p.check_quick().expect("unchanged");
    }
}
