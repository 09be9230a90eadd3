//! Why a request is not served, in kvtier's words.
//!
//! The request layer ([`crate::state`], [`crate::read`], [`crate::auth`],
//! [`crate::limits`]) decides a refusal once, as a [`Refusal`]; each front
//! converts it at its own edge ([`crate::status`]: a gRPC status with the
//! retry hint in `grpc-retry-pushback-ms`, an HTTP status with
//! `Retry-After`, a data-plane error frame with `retry_pushback_ms`), as it
//! converts core errors. docs/operations.md ("What a refused client sees")
//! lists what each front sends.
use kvtier_core::error::{Error, ErrorKind};
use std::borrow::Cow;
use std::time::Duration;

/// What the caller can do about a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Malformed request: fix it, do not retry.
    InvalidArgument,
    /// The payload does not match its checksum.
    DataLoss,
    /// A named thing (key, lease) does not exist.
    NotFound,
    /// A precondition does not hold (expired lease, no ptrace rights, ...).
    FailedPrecondition,
    /// Larger than a limit of this server whatever its load: raise the
    /// setting named in the message; retrying cannot help.
    ResourceExhausted,
    /// A tier or a peer is unreachable right now.
    Unavailable,
    /// Shed for overload: retry after [`Refusal::retry_after`], with back-off.
    Overloaded,
    /// The request's deadline passed.
    DeadlineExceeded,
    /// The caller went away before the answer.
    Cancelled,
    /// No credentials, or unknown ones.
    Unauthenticated,
    /// Known credentials without the right.
    PermissionDenied,
    /// A bug or an unexpected failure.
    Internal,
}

/// A request the server will not serve: the kind, a message naming the
/// limit or key involved (and the setting that raises it), and when a shed
/// request is worth retrying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What the caller can do about it.
    pub kind: Kind,
    /// For the caller; names the culprit.
    pub message: String,
    /// For [`Kind::Overloaded`]: about when the backlog will have moved.
    pub retry_after: Option<Duration>,
}

impl Refusal {
    /// A refusal of `kind` with `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// A malformed request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Kind::InvalidArgument, message)
    }

    /// The outcome label of the request metrics (`kvtier_requests_total{code}`):
    /// the gRPC code names every front has always reported; a shed request is
    /// `unavailable`, as its clients see it.
    pub fn label(&self) -> &'static str {
        self.kind.label()
    }
}

impl Kind {
    /// See [`Refusal::label`].
    pub fn label(self) -> &'static str {
        match self {
            Kind::InvalidArgument => "invalid_argument",
            Kind::DataLoss => "data_loss",
            Kind::NotFound => "not_found",
            Kind::FailedPrecondition => "failed_precondition",
            Kind::ResourceExhausted => "resource_exhausted",
            Kind::Unavailable | Kind::Overloaded => "unavailable",
            Kind::DeadlineExceeded => "deadline_exceeded",
            Kind::Cancelled => "cancelled",
            Kind::Unauthenticated => "unauthenticated",
            Kind::PermissionDenied => "permission_denied",
            Kind::Internal => "internal",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.message)
    }
}

impl std::error::Error for Refusal {}

impl From<ErrorKind> for Kind {
    fn from(k: ErrorKind) -> Self {
        match k {
            ErrorKind::InvalidArgument => Kind::InvalidArgument,
            ErrorKind::DataLoss => Kind::DataLoss,
            ErrorKind::NotFound => Kind::NotFound,
            ErrorKind::FailedPrecondition => Kind::FailedPrecondition,
            ErrorKind::ResourceExhausted => Kind::ResourceExhausted,
            ErrorKind::Unavailable => Kind::Unavailable,
            ErrorKind::DeadlineExceeded => Kind::DeadlineExceeded,
            ErrorKind::Internal => Kind::Internal,
        }
    }
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Self::new(e.kind.into(), e.message)
    }
}

/// The metrics outcome of a result: `ok` or the refusal's label.
pub fn outcome<T>(r: &Result<T, Refusal>) -> Cow<'static, str> {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.label().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_errors_keep_their_kind_and_message() {
        let r = Refusal::from(Error::exhausted("memory tier full (memory.capacity)"));
        assert_eq!(r.kind, Kind::ResourceExhausted);
        assert_eq!(r.message, "memory tier full (memory.capacity)");
        assert_eq!(r.retry_after, None);
    }

    #[test]
    fn a_shed_request_is_reported_as_its_clients_see_it() {
        assert_eq!(Kind::Overloaded.label(), "unavailable");
        assert_eq!(
            outcome::<()>(&Err(Refusal::invalid("x"))),
            "invalid_argument"
        );
        assert_eq!(outcome(&Ok(())), "ok");
    }
}
