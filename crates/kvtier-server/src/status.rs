//! The one place refusals and core errors become protocol statuses: each
//! front's edge (gRPC, HTTP, the data plane's error frame) calls these.
use crate::refusal::{Kind, Refusal};
use kvtier_core::error::Error;
use std::time::Duration;

/// gRPC metadata that carries a shed request's retry hint (gRFC A6).
pub const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// gRPC status for a core error.
pub fn to_status(e: Error) -> tonic::Status {
    tonic::Status::from(Refusal::from(e))
}

/// The gRPC code of a refusal kind (also the data plane's error code).
pub fn grpc_code(kind: Kind) -> tonic::Code {
    match kind {
        Kind::InvalidArgument => tonic::Code::InvalidArgument,
        Kind::DataLoss => tonic::Code::DataLoss,
        Kind::NotFound => tonic::Code::NotFound,
        Kind::FailedPrecondition => tonic::Code::FailedPrecondition,
        Kind::ResourceExhausted => tonic::Code::ResourceExhausted,
        Kind::Unavailable | Kind::Overloaded => tonic::Code::Unavailable,
        Kind::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        Kind::Cancelled => tonic::Code::Cancelled,
        Kind::Unauthenticated => tonic::Code::Unauthenticated,
        Kind::PermissionDenied => tonic::Code::PermissionDenied,
        Kind::Internal => tonic::Code::Internal,
    }
}

/// A shed request's hint in whole milliseconds, as the gRPC metadata and
/// the data plane's `retry_pushback_ms` carry it (0: none).
pub fn pushback_ms(r: &Refusal) -> u32 {
    r.retry_after
        .map_or(0, |d| d.as_millis().min(u32::MAX.into()) as u32)
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        let hint = pushback_ms(&r);
        let mut status = tonic::Status::new(grpc_code(r.kind), r.message);
        if let (true, Ok(v)) = (hint > 0, hint.to_string().parse()) {
            status.metadata_mut().insert(PUSHBACK, v);
        }
        status
    }
}

/// A refusal from a gRPC status made by code outside the request layer
/// (kvtier-proto's bounded decoding, a peer's answer), for the data plane
/// and HTTP fronts.
pub fn from_status(s: &tonic::Status) -> Refusal {
    use tonic::Code as C;
    let kind = match s.code() {
        C::InvalidArgument | C::OutOfRange => Kind::InvalidArgument,
        C::DataLoss => Kind::DataLoss,
        C::NotFound => Kind::NotFound,
        C::FailedPrecondition | C::AlreadyExists | C::Aborted => Kind::FailedPrecondition,
        C::ResourceExhausted => Kind::ResourceExhausted,
        C::Unavailable if s.metadata().contains_key(PUSHBACK) => Kind::Overloaded,
        C::Unavailable => Kind::Unavailable,
        C::DeadlineExceeded => Kind::DeadlineExceeded,
        C::Cancelled => Kind::Cancelled,
        C::Unauthenticated => Kind::Unauthenticated,
        C::PermissionDenied => Kind::PermissionDenied,
        C::Ok | C::Unknown | C::Unimplemented | C::Internal => Kind::Internal,
    };
    let retry_after = s
        .metadata()
        .get(PUSHBACK)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map(Duration::from_millis);
    Refusal {
        kind,
        message: s.message().to_owned(),
        retry_after,
    }
}

/// HTTP status and a stable machine-readable code for a core error.
pub fn to_http(e: &Error) -> (http::StatusCode, &'static str) {
    http_status(e.kind.into())
}

/// HTTP status and the body's machine-readable `code` for a refusal kind.
pub fn http_status(kind: Kind) -> (http::StatusCode, &'static str) {
    use http::StatusCode as S;
    match kind {
        Kind::InvalidArgument => (S::BAD_REQUEST, "invalid_argument"),
        Kind::DataLoss => (S::BAD_REQUEST, "checksum_mismatch"),
        Kind::NotFound => (S::NOT_FOUND, "not_found"),
        Kind::FailedPrecondition => (S::CONFLICT, "failed_precondition"),
        Kind::ResourceExhausted => (S::INSUFFICIENT_STORAGE, "resource_exhausted"),
        Kind::Unavailable | Kind::Overloaded => (S::SERVICE_UNAVAILABLE, "unavailable"),
        Kind::DeadlineExceeded => (S::GATEWAY_TIMEOUT, "deadline_exceeded"),
        // nginx's 499: the client closed the request; never seen by it.
        Kind::Cancelled => (S::from_u16(499).unwrap_or(S::BAD_REQUEST), "cancelled"),
        Kind::Unauthenticated => (S::UNAUTHORIZED, "unauthenticated"),
        Kind::PermissionDenied => (S::FORBIDDEN, "permission_denied"),
        Kind::Internal => (S::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// Name of a gRPC code for metrics labels (a peer's or tonic's own status).
pub fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        Ok => "ok",
        Cancelled => "cancelled",
        Unknown => "unknown",
        InvalidArgument => "invalid_argument",
        DeadlineExceeded => "deadline_exceeded",
        NotFound => "not_found",
        AlreadyExists => "already_exists",
        PermissionDenied => "permission_denied",
        ResourceExhausted => "resource_exhausted",
        FailedPrecondition => "failed_precondition",
        Aborted => "aborted",
        OutOfRange => "out_of_range",
        Unimplemented => "unimplemented",
        Internal => "internal",
        Unavailable => "unavailable",
        DataLoss => "data_loss",
        Unauthenticated => "unauthenticated",
    }
}

/// The metrics outcome of a gRPC result: `ok` or the status code name.
pub fn result_code<T>(r: &Result<T, tonic::Status>) -> std::borrow::Cow<'static, str> {
    match r {
        Ok(_) => "ok".into(),
        Err(s) => code_name(s.code()).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_refusal_carries_its_hint_through_grpc_and_back() {
        let mut r = Refusal::new(Kind::Overloaded, "server overloaded");
        r.retry_after = Some(Duration::from_millis(40));
        let s = tonic::Status::from(r.clone());
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(s.metadata().get(PUSHBACK).unwrap(), "40");
        assert_eq!(from_status(&s), r);
    }

    #[test]
    fn an_unavailable_tier_is_not_a_shed_request() {
        let s = tonic::Status::from(Refusal::new(Kind::Unavailable, "object store down"));
        assert!(s.metadata().get(PUSHBACK).is_none());
        assert_eq!(from_status(&s).kind, Kind::Unavailable);
    }
}
