//! A refusal sent before a frame's body was read, then a lingering close
//! (see [`crate::limits::refused`]): the Error frame is written, the write
//! side shut (the client reads the frame, then end of stream), and the rest
//! of the frame drained, bounded in bytes and time, before the connection
//! closes. Without the drain, closing with the client's bytes unread resets
//! the connection and the client may never see the answer.
use super::{Reply, write_reply};
use crate::limits::{Limits, refused};
use crate::rx_stamp::FrameStream;
use kvtier_proto::wire::discard;
use prost::Message;
use tokio::io::AsyncWriteExt;

/// Answers `reply` to the frame `request_id`, of which `unread` bytes were
/// not read, and drains them; the caller then closes the connection.
pub(super) async fn refuse<S: FrameStream>(
    sock: &mut S,
    limits: &Limits,
    request_id: u64,
    reply: Reply,
    unread: u64,
    kind: &'static str,
) -> std::io::Result<()> {
    if let Ok(e) = kvtier_proto::v1::WireError::decode(&reply.meta[..]) {
        refused::log(kind, &e.message);
    }
    write_reply(sock, limits.write_timeout, request_id, reply).await?;
    let _ = sock.shutdown().await;
    let by = tokio::time::Instant::now() + refused::drain_time(limits.read_timeout);
    let n = unread.min(refused::DRAIN_BYTES);
    let _ = tokio::time::timeout_at(by, discard(sock, n)).await;
    Ok(())
}
