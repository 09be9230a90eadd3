//! A gRPC reply body that keeps its connection in use while it goes out,
//! and is dropped when the client takes none of it for
//! `server.write_timeout` (see [`InUseBody`]).
use super::InUse;
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A response body that keeps its connection in use until it is done or
/// dropped, and that is dropped early once it has waited
/// `server.write_timeout` for the client to take its next frame: what it
/// holds (a streamed Read's admission and the task producing it, the
/// connection's use) is given back, and the stream is reset when HTTP/2
/// next asks it for more. With HTTP/2 flow control a client that stops
/// reading never makes the server's writes wait: hyper just stops asking
/// the body for more, and nothing else would notice.
pub(super) struct InUseBody {
    reply: Arc<Mutex<Reply>>,
    /// Dropped with the body: ends its watchdog.
    _watch: oneshot::Sender<()>,
}

struct Reply {
    /// The body and its connection's use; `None` once the watchdog dropped them.
    body: Option<(tonic::body::Body, Option<InUse>)>,
    /// Since when the body has waited to be asked for its next frame (the
    /// client's turn); `None` while HTTP/2 waits on the body (the server's).
    client_turn: Option<Instant>,
}

impl InUseBody {
    pub(super) fn new(body: tonic::body::Body, in_use: Option<InUse>, idle: Duration) -> Self {
        let reply = Arc::new(Mutex::new(Reply {
            body: Some((body, in_use)),
            client_turn: Some(Instant::now()),
        }));
        let (watch, ended) = oneshot::channel();
        tokio::spawn(watchdog(Arc::downgrade(&reply), idle, ended));
        Self {
            reply,
            _watch: watch,
        }
    }
}

/// Drops `reply`'s body once it has been the client's turn for `idle`;
/// returns when the body is dropped.
async fn watchdog(reply: Weak<Mutex<Reply>>, idle: Duration, mut ended: oneshot::Receiver<()>) {
    let mut at = Instant::now() + idle;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = &mut ended => return,
        }
        let Some(reply) = reply.upgrade() else { return };
        let mut r = reply.lock();
        let now = Instant::now();
        match r.client_turn {
            Some(since) if now >= since + idle => {
                let body = r.body.take();
                drop(r);
                drop(body);
                super::stalled("grpc", idle);
                return;
            }
            Some(since) => at = since + idle,
            None => at = now + idle,
        }
    }
}

impl http_body::Body for InUseBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let mut r = self.reply.lock();
        let Some((body, _)) = r.body.as_mut() else {
            return Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(
                "reply not taken by the client within server.write_timeout",
            ))));
        };
        let polled = Pin::new(body).poll_frame(cx);
        r.client_turn = match &polled {
            Poll::Ready(Some(Ok(_))) => Some(Instant::now()),
            _ => None,
        };
        polled
    }

    fn is_end_stream(&self) -> bool {
        let r = self.reply.lock();
        r.body.as_ref().is_some_and(|(b, _)| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let r = self.reply.lock();
        r.body
            .as_ref()
            .map_or_else(http_body::SizeHint::default, |(b, _)| b.size_hint())
    }
}
