//! A gRPC request body charged to the request memory as it arrives, and
//! cut when it stops arriving (see [`super::ChargeLayer`]).
use super::{BoxError, Held, Limits};
use std::future::Future;

/// The `kvtier.v1` and `kvstore` calls whose request body is a stream of
/// messages, open as long as the client likes: only the server's waits for
/// their next bytes are bounded, each by `server.read_timeout`.
pub(super) const CLIENT_STREAMING: [&str; 2] = [
    "/kvtier.v1.KvTier/WriteStream",
    "/kvstore.KVStoreService/StreamingRead",
];

/// How many bytes of request memory one received byte of a call's body is
/// charged: 1, except for Lookups, whose token lists decode larger than they
/// arrive (a one-byte varint becomes a 4-byte `uint32` in kvtier.v1 and an
/// 8-byte `int64` in kvstore; the lists are reserved at their final size,
/// `kvtier_proto::bounded`), so the decoded list is charged too.
pub(super) fn charge_factor(path: &str) -> u64 {
    match path {
        "/kvtier.v1.KvTier/Lookup" => 1 + 4,
        "/kvstore.KVStoreService/Lookup" => 1 + 8,
        _ => 1,
    }
}

pub(super) struct ChargedBody<B> {
    pub(super) inner: std::pin::Pin<Box<B>>,
    pub(super) limits: Limits,
    pub(super) held: Held,
    /// Bytes charged per byte received ([`charge_factor`]).
    pub(super) factor: u64,
    /// Fires when the body is late (see [`ChargeLayer`]); made the first
    /// time the body is not ready (most bodies never are: no timer for them).
    pub(super) stall: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// When the request started.
    pub(super) start: tokio::time::Instant,
    /// `stall` counts from `start` (unary calls); otherwise it is armed when
    /// the server starts waiting for more.
    pub(super) whole_body: bool,
    /// Whether `stall` is armed.
    pub(super) waiting: bool,
    /// For a stream of messages ([`CLIENT_STREAMING`]): where its messages
    /// end, so that each one's bytes are given back once it was handled.
    pub(super) framing: Option<Framing>,
    /// Whether the first message's length prefix was read: a message that
    /// can never fit the request memory is refused then, before its bytes
    /// fill the budget (and refuse other requests as busy).
    pub(super) sized: bool,
}

/// Where the messages of a gRPC body end (each is a 1-byte flag and a
/// 4-byte big-endian length, then that many bytes).
///
/// The server asks a streaming body for more bytes only when it has taken
/// every message received whole and handled it (`WriteStream` stores a
/// message's blocks before it asks for the next; tonic decodes what it
/// already has before it reads more). So when it asks, the bytes of the
/// messages received whole are no longer held, and their charge is given
/// back: a stream holds the message in hand, not everything it ever sent.
#[derive(Default)]
pub(super) struct Framing {
    /// The current message's prefix bytes received so far.
    prefix: [u8; 5],
    have: usize,
    /// Bytes of the current message's body still to come (0: in its prefix).
    left: u64,
    /// Bytes of the current message received so far.
    part: u64,
    /// Bytes of messages received whole since [`Framing::take_whole`].
    whole: u64,
}

impl Framing {
    /// Follows the received bytes `d`.
    fn feed(&mut self, mut d: &[u8]) {
        while !d.is_empty() {
            let n = if self.left == 0 {
                let n = (self.prefix.len() - self.have).min(d.len());
                self.prefix[self.have..self.have + n].copy_from_slice(&d[..n]);
                self.have += n;
                if self.have == self.prefix.len() {
                    self.have = 0;
                    let [_, len @ ..] = self.prefix;
                    self.left = u64::from(u32::from_be_bytes(len));
                }
                n
            } else {
                let n = self.left.min(d.len() as u64) as usize;
                self.left -= n as u64;
                n
            };
            self.part += n as u64;
            d = &d[n..];
            if self.left == 0 && self.have == 0 {
                self.whole += std::mem::take(&mut self.part);
            }
        }
    }

    /// Bytes of the messages received whole since the last call.
    fn take_whole(&mut self) -> u64 {
        std::mem::take(&mut self.whole)
    }
}

impl<B> http_body::Body for ChargedBody<B>
where
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        // Asked for more: the messages received whole were handled.
        if let Some(f) = this.framing.as_mut() {
            let whole = f.take_whole();
            if whole > 0 {
                super::release(&this.held, whole * this.factor);
            }
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // Only the body's first bytes are a length prefix: once any
                // arrived the check is over (a prefix split across frames is
                // not read; the budget still refuses that message as it comes).
                if let Some(d) = frame.data_ref()
                    && !this.sized
                    && !d.is_empty()
                {
                    this.sized = true;
                    if d.len() >= 5 {
                        let len = u32::from_be_bytes([d[1], d[2], d[3], d[4]]);
                        let declared = (5 + u64::from(len)) * this.factor;
                        if let Some(never) = this.limits.too_large(declared) {
                            crate::limits::refused::log("grpc_too_large", &never.message);
                            let status = tonic::Status::from(never);
                            return Poll::Ready(Some(Err(Box::new(status))));
                        }
                    }
                }
                if let Some(d) = frame.data_ref() {
                    match this.limits.reserve(d.len() as u64 * this.factor) {
                        Ok(r) => this.held.lock().push(r),
                        Err(refusal) => {
                            let status = tonic::Status::from(refusal);
                            return Poll::Ready(Some(Err(Box::new(status))));
                        }
                    }
                    if let Some(f) = this.framing.as_mut() {
                        f.feed(d);
                    }
                    if !this.whole_body {
                        this.waiting = false;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let by = if !this.waiting {
                    // The server asks for more and there is none yet: from
                    // now on it waits on the client.
                    this.waiting = true;
                    Some(tokio::time::Instant::now() + this.limits.read_timeout)
                } else if this.stall.is_none() {
                    Some(this.start + this.limits.read_timeout) // a unary call's whole body
                } else {
                    None
                };
                match (by, &mut this.stall) {
                    (Some(by), Some(stall)) => stall.as_mut().reset(by),
                    (Some(by), None) => this.stall = Some(Box::pin(tokio::time::sleep_until(by))),
                    (None, _) => {}
                }
                let stall = this.stall.as_mut().expect("armed above");
                if stall.as_mut().poll(cx).is_ready() {
                    let status = tonic::Status::deadline_exceeded(format!(
                        "request body not received within {:?} (server.read_timeout)",
                        this.limits.read_timeout
                    ));
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Message ends are found however the bytes are split into frames.
    #[test]
    fn framing_finds_each_message_end() {
        let mut body = Vec::new();
        let mut ends = Vec::new();
        for len in [0usize, 3, 70_000, 1] {
            body.push(0);
            body.extend_from_slice(&(len as u32).to_be_bytes());
            body.resize(body.len() + len, 9);
            ends.push(body.len() as u64);
        }
        for chunk in [1, 2, 4, 5, 7, 4096, body.len()] {
            let mut f = Framing::default();
            let mut at = 0u64;
            let mut whole = 0u64;
            for c in body.chunks(chunk) {
                f.feed(c);
                at += c.len() as u64;
                whole += f.take_whole();
                let expect = ends.iter().copied().filter(|&e| e <= at).max().unwrap_or(0);
                assert_eq!(whole, expect, "chunks of {chunk}, at {at}");
            }
        }
    }
}
