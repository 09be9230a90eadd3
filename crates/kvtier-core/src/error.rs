//! One error type for the core, with a kind that fronts map to gRPC / HTTP status
//! codes in one place each.
use std::fmt;

/// What went wrong, coarse enough to map onto a protocol status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed (bad key, bad namespace, oversized payload, ...).
    InvalidArgument,
    /// The payload does not match its checksum.
    DataLoss,
    /// A named thing (key, lease) does not exist.
    NotFound,
    /// The request's precondition no longer holds (expired lease, ...).
    FailedPrecondition,
    /// No room: capacity exhausted and nothing evictable.
    ResourceExhausted,
    /// A tier is unreachable right now.
    Unavailable,
    /// The request's deadline passed.
    DeadlineExceeded,
    /// A bug or an unexpected I/O failure.
    Internal,
}

/// The core's error: a kind plus a human-readable message naming the culprit.
#[derive(Debug, Clone, thiserror::Error)]
pub struct Error {
    /// Coarse category, used for status mapping.
    pub kind: ErrorKind,
    /// Message for the caller; names the limit, key or path involved.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

macro_rules! ctor {
    ($name:ident, $kind:ident) => {
        #[doc = concat!("An error of kind [`ErrorKind::", stringify!($kind), "`].")]
        pub fn $name(message: impl Into<String>) -> Self {
            Self {
                kind: ErrorKind::$kind,
                message: message.into(),
            }
        }
    };
}

impl Error {
    ctor!(invalid, InvalidArgument);
    ctor!(data_loss, DataLoss);
    ctor!(not_found, NotFound);
    ctor!(precondition, FailedPrecondition);
    ctor!(exhausted, ResourceExhausted);
    ctor!(unavailable, Unavailable);
    ctor!(deadline, DeadlineExceeded);
    ctor!(internal, Internal);

    /// The same error with `context` before its message ("context: message"):
    /// callers add where it happened without losing what kind it is.
    pub fn context(mut self, context: impl std::fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

/// Result alias for the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;
