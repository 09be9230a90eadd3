//! The data plane before Hello: a connection whose client has not named a
//! token yet (docs/wire.md, docs/security.md) may send one thing, a Hello
//! frame with a small metadata and no payload. It is read into a buffer of
//! its own, never charged to the shared `server.request_memory`; anything
//! else is refused on its header, its body unread, and the connection
//! closed. Why: the request memory was reserved for a frame's metadata
//! before Hello had authenticated anyone, so a 24-byte header announcing
//! 127 MiB of metadata, then silence, held a 128 MiB budget for
//! `server.read_timeout` and every authenticated write was refused as busy.
use super::{Reply, linger, status_reply, write_reply};
use crate::auth::Principal;
use crate::refusal::Refusal;
use crate::rx_stamp::FrameStream;
use crate::state::Shared;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{Header, Kind, read_exact_bytes};
use prost::Message;

/// The most metadata a Hello frame may carry (its token and little else).
pub(crate) const MAX_HELLO_META: u32 = 4096;

/// Serves a frame that arrived while the connection is not authenticated,
/// or any Hello: the connection's principal once its Hello named a known
/// token (or authentication is off), or `None` when the connection must
/// close (the refusal has been answered).
pub(super) async fn gate<S: FrameStream>(
    sock: &mut S,
    shared: &Shared,
    header: &Header,
    by: tokio::time::Instant,
) -> std::io::Result<Option<Principal>> {
    let unread = u64::from(header.meta_len) + u64::from(header.data_len);
    let refused = if header.kind != Kind::Hello {
        let d = crate::auth::Denied::Unauthenticated(
            "this server requires a token: send a Hello frame first (docs/wire.md)".into(),
        );
        shared.metrics.observe_denied(&d);
        Some((Refusal::from(d), "wire_auth"))
    } else if header.meta_len > MAX_HELLO_META || header.data_len > 0 {
        let msg = format!(
            "a Hello frame carries at most {MAX_HELLO_META} bytes of metadata and no payload; \
             this one announced {} and {} (docs/wire.md)",
            header.meta_len, header.data_len
        );
        Some((Refusal::invalid(msg), "wire_hello"))
    } else {
        None
    };
    if let Some((r, kind)) = refused {
        let limits = &shared.limits;
        let reply = status_reply(r);
        linger::refuse(sock, limits, header.request_id, reply, unread, kind).await?;
        return Ok(None);
    }
    let meta = tokio::time::timeout_at(by, read_exact_bytes(sock, header.meta_len as usize))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "Hello not received within server.read_timeout",
            )
        })??;
    let token = pb::WireHello::decode(meta)
        .map(|h| h.token)
        .unwrap_or_default();
    let write_timeout = shared.limits.write_timeout;
    match shared.auth.identify_token(&token) {
        Ok(p) => {
            let reply = Reply {
                kind: Kind::HelloReply,
                meta: Vec::new(),
                data: Vec::new(),
                hold: None,
                charge: None,
                fds: Vec::new(),
            };
            write_reply(sock, write_timeout, header.request_id, reply).await?;
            Ok(Some(p))
        }
        Err(d) => {
            shared.metrics.observe_denied(&d);
            let reply = status_reply(d.into());
            write_reply(sock, write_timeout, header.request_id, reply).await?;
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    /// A token is far below the Hello limit, and the limit far below the
    /// request memory's smallest default (64 MiB).
    #[test]
    fn the_hello_limit_fits_a_token() {
        let hello = prost::Message::encode_to_vec(&kvtier_proto::v1::WireHello {
            token: "t".repeat(512),
        });
        assert!(hello.len() < super::MAX_HELLO_META as usize);
    }
}
