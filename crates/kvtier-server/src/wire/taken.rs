//! A reply writer that gives up on a client that stops reading: its write
//! fails once it has waited `server.write_timeout` for the client to take
//! more bytes, so a stalled client holds its reply's payloads, admission and
//! connection no longer.
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;

/// The error of a reply write that waited too long: the connection is
/// closed and the drop counted (`kvtier_stalled_replies_total`).
#[derive(Debug)]
pub(super) struct Stalled;

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reply not taken within server.write_timeout: the client stopped reading")
    }
}

impl std::error::Error for Stalled {}

/// Whether `e` ended a connection because its client stopped reading.
pub(super) fn is_stalled(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .and_then(|e| e.get_ref())
        .is_some_and(|e| e.is::<Stalled>())
}

/// A writer whose write fails once it has waited `idle` for the client to
/// take more bytes (see `write_reply` in the parent module).
pub(super) struct Taken<'a, S> {
    pub(super) io: &'a mut S,
    pub(super) idle: Duration,
    /// Armed while a write waits on the client; disarmed by progress.
    pub(super) stall: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Taken<'_, S> {
    fn waited<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.stall = None;
            return polled;
        }
        let idle = self.idle;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                Stalled,
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Taken<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut *self.io).poll_write(cx, buf);
        self.waited(cx, polled)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut *self.io).poll_write_vectored(cx, bufs);
        self.waited(cx, polled)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut *self.io).poll_flush(cx);
        self.waited(cx, polled)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}
