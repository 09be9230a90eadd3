//! What the data plane answers: a reply frame, or a refusal as an error
//! frame (docs/wire.md, "Errors").
use crate::refusal::{self, Refusal};
use crate::state;
use bytes::Bytes;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use prost::Message;

pub(super) struct Reply {
    pub(super) kind: Kind,
    pub(super) meta: Vec<u8>,
    pub(super) data: Vec<Bytes>,
    /// The request's admission, given back once the reply is written: a
    /// read's cost is mostly sending its payloads, and the concurrency limit
    /// must see it (docs/operations.md, "Load shedding").
    pub(super) hold: Option<state::Hold>,
    /// The reply's payload bytes in the reply budget (`server.reply_memory`),
    /// given back once the reply is written or dropped.
    pub(super) charge: Option<crate::limits::Reservation>,
    /// Segments whose descriptors go with the frame's first byte (the
    /// same-host front's MapRead and Lend, `super::shared_memory`).
    pub(super) fds: Vec<std::sync::Arc<kvtier_shm::Segment>>,
}

pub(super) fn error_reply(kind: refusal::Kind, message: impl Into<String>) -> Reply {
    status_reply(Refusal::new(kind, message))
}

fn error_frame(e: pb::WireError) -> Reply {
    Reply {
        kind: Kind::Error,
        meta: e.encode_to_vec(),
        data: Vec::new(),
        hold: None,
        charge: None,
        fds: Vec::new(),
    }
}

/// A refusal as the data plane's error frame: the gRPC code number, the
/// message and a shed request's retry hint (docs/wire.md).
pub(super) fn status_reply(r: Refusal) -> Reply {
    error_frame(pb::WireError {
        code: crate::status::grpc_code(r.kind) as i32,
        retry_pushback_ms: crate::status::pushback_ms(&r),
        message: r.message,
        reason: String::new(),
    })
}
