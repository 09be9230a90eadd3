//! The one place core errors become protocol statuses.
use kvtier_core::error::{Error, ErrorKind};

/// gRPC status for a core error.
pub fn to_status(e: Error) -> tonic::Status {
    let code = match e.kind {
        ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorKind::DataLoss => tonic::Code::DataLoss,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        ErrorKind::Internal => tonic::Code::Internal,
    };
    tonic::Status::new(code, e.message)
}

/// HTTP status and a stable machine-readable code for a core error.
pub fn to_http(e: &Error) -> (http::StatusCode, &'static str) {
    use http::StatusCode as S;
    match e.kind {
        ErrorKind::InvalidArgument => (S::BAD_REQUEST, "invalid_argument"),
        ErrorKind::DataLoss => (S::BAD_REQUEST, "checksum_mismatch"),
        ErrorKind::NotFound => (S::NOT_FOUND, "not_found"),
        ErrorKind::FailedPrecondition => (S::CONFLICT, "failed_precondition"),
        ErrorKind::ResourceExhausted => (S::INSUFFICIENT_STORAGE, "resource_exhausted"),
        ErrorKind::Unavailable => (S::SERVICE_UNAVAILABLE, "unavailable"),
        ErrorKind::DeadlineExceeded => (S::GATEWAY_TIMEOUT, "deadline_exceeded"),
        ErrorKind::Internal => (S::INTERNAL_SERVER_ERROR, "internal"),
    }
}
