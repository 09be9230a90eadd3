//! One error type for the core, with a kind that fronts map to gRPC / HTTP status
//! codes in one place each.
use std::fmt;
use std::sync::Arc;

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

/// The core's error: a kind (what the caller can do about it), a message
/// naming the culprit with the context added on the way up, and the
/// underlying error (an `io::Error`, the object store's) when there is one,
/// reachable through [`std::error::Error::source`] for logs.
#[derive(Debug, Clone)]
pub struct Error {
    /// Coarse category, used for status mapping.
    pub kind: ErrorKind,
    /// Message for the caller; names the limit, key or path involved.
    pub message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
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
                source: None,
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

    /// The same error with `source` as its cause (kept for logs; the message
    /// should already say what it means for the caller).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }
}

/// Result alias for the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;
