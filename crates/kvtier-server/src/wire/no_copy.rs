//! The refusals of ReadInto/WriteFrom (`super::memory_copy`): "this server
//! cannot copy into or out of your process" carries its own reason,
//! [`NO_MEMORY_COPY`], the only refusal after which clients stop asking for
//! copies (docs/local.md); the rest are the request's own. No message names
//! a pid (docs/security.md, "Threats and their guards").
use super::{Reply, status_reply};
use crate::peer;
use crate::refusal::{self, Refusal};
use kvtier_proto::v1 as pb;
use nix::errno::Errno;
use prost::Message;

/// The `WireError.reason` of "this server cannot copy into or out of your
/// process": clients then send Read/Write with bytes instead, and only this
/// reason turns their copies off (docs/wire.md).
pub(super) const NO_MEMORY_COPY: &str = "no_memory_copy";

/// The error frame for [`NO_MEMORY_COPY`]: FAILED_PRECONDITION with the reason.
pub(super) fn no_copy_reply(why: &peer::Refused) -> Reply {
    with_reason(status_reply(no_copy(why)))
}

/// `r`, an error frame of [`no_copy`], with its reason set.
pub(super) fn with_reason(mut r: Reply) -> Reply {
    let mut e = pb::WireError::decode(&r.meta[..]).unwrap_or_default();
    e.reason = NO_MEMORY_COPY.into();
    r.meta = e.encode_to_vec();
    r
}

/// The refusal of [`NO_MEMORY_COPY`] (its reason set by [`with_reason`]).
pub(super) fn no_copy(why: &peer::Refused) -> Refusal {
    Refusal::new(
        refusal::Kind::FailedPrecondition,
        format!(
            "kvtier cannot copy into or out of this process: {why} (docs/local.md); \
             send Read/Write over the socket instead"
        ),
    )
}

/// Why a copy between processes failed.
pub(super) enum CopyError {
    /// The server may not touch the client's memory (no ptrace rights, the
    /// process gone, changed or invisible from here): [`NO_MEMORY_COPY`],
    /// and the client sends bytes over the socket instead.
    Denied(peer::Refused),
    /// A region is not readable/writable memory of the client.
    Fault(usize),
}

impl From<peer::Refused> for CopyError {
    fn from(r: peer::Refused) -> Self {
        CopyError::Denied(r)
    }
}

pub(super) fn panicked() -> CopyError {
    CopyError::Denied(peer::Refused("a copy thread failed".into()))
}

/// A ReadInto/WriteFrom refused: for a reason of the request, or because
/// the server cannot copy into this process at all ([`NO_MEMORY_COPY`]).
pub(super) enum Failed {
    Refused(Refusal),
    NoCopy(peer::Refused),
}

impl From<Refusal> for Failed {
    fn from(r: Refusal) -> Self {
        Failed::Refused(r)
    }
}

impl Failed {
    pub(super) fn label(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Failed::Refused(r) => r.label().into(),
            Failed::NoCopy(_) => refusal::Kind::FailedPrecondition.label().into(),
        }
    }

    pub(super) fn reply(self) -> Reply {
        match self {
            Failed::Refused(r) => status_reply(r),
            Failed::NoCopy(why) => no_copy_reply(&why),
        }
    }
}

impl CopyError {
    pub(super) fn failed(self, what: &str) -> Failed {
        match self {
            CopyError::Denied(why) => Failed::NoCopy(why),
            CopyError::Fault(i) => Failed::Refused(Refusal::invalid(format!(
                "the memory named for block {i} is not {} memory of the calling process",
                if what == "into" {
                    "writable"
                } else {
                    "readable"
                }
            ))),
        }
    }
}

pub(super) fn classify(e: Errno, i: usize) -> CopyError {
    match e {
        Errno::EFAULT | Errno::EINVAL => CopyError::Fault(i),
        // No pid in the message: the caller learns nothing of other processes.
        Errno::ESRCH => {
            CopyError::Denied(peer::Refused("the connecting process has exited".into()))
        }
        _ => CopyError::Denied(peer::Refused(format!(
            "{e} (the server needs ptrace rights over the client: the same user, or \
             CAP_SYS_PTRACE)"
        ))),
    }
}
