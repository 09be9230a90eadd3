//! Refusals answered before a request's body is read (a body over a limit,
//! a busy request memory): the answer must reach a client that is still
//! sending. Closing a socket with unread bytes in it makes the kernel reset
//! the connection, and the reset can destroy the answer before the client
//! reads it (it then sees `Connection reset by peer` and retries). So the
//! body is drained, bounded, after the answer was sent: nginx's lingering
//! close (docs/operations.md, "What a refused client sees").
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most bytes of a refused request's body read and thrown away.
pub const DRAIN_BYTES: u64 = 1 << 30;

/// Longest a refused request's body is drained: 5 s, or
/// `server.read_timeout` when that is shorter.
pub fn drain_time(read_timeout: Duration) -> Duration {
    read_timeout.min(Duration::from_secs(5))
}

static LAST: Mutex<Vec<(&'static str, Instant)>> = Mutex::new(Vec::new());

/// Logs a refusal at most once a second per `kind` (a client retrying in a
/// loop must not flood the log; the metrics count every one).
pub fn log(kind: &'static str, message: &str) {
    if first_this_second(kind) {
        tracing::info!(kind, message, "request refused before its body was read");
    }
}

/// Logs a reply dropped on `front` because its client stopped reading, at
/// most once a second per front (the metric counts every one).
pub fn log_dropped(front: &'static str, message: &str) {
    if first_this_second(front) {
        tracing::info!(front, message, "reply dropped, connection closed");
    }
}

fn first_this_second(kind: &'static str) -> bool {
    let now = Instant::now();
    {
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        match last.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, t)) if now.duration_since(*t) < Duration::from_secs(1) => return false,
            Some((_, t)) => *t = now,
            None => last.push((kind, now)),
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_time_is_the_shorter_of_5s_and_the_read_timeout() {
        assert_eq!(drain_time(Duration::from_secs(60)), Duration::from_secs(5));
        assert_eq!(
            drain_time(Duration::from_millis(300)),
            Duration::from_millis(300)
        );
    }
}
