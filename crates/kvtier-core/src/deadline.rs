//! The deadline of the request being served, visible to the tiers below the
//! engine without threading it through every signature.
//!
//! Fronts run each request inside [`scope`] with the client's deadline (gRPC:
//! the `grpc-timeout` header); a tier that talks to a remote service (the
//! object store) asks [`budget`] how long it may wait and fails with
//! `UNAVAILABLE` before the client gives up, instead of hanging until the
//! client sees `DEADLINE_EXCEEDED` with no explanation.
use std::future::Future;
use std::time::{Duration, Instant};
use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static DEADLINE: Option<Instant>;
}

/// Runs `f` with `deadline` as the current request deadline.
pub fn scope<F: Future>(deadline: Option<Instant>, f: F) -> TaskLocalFuture<Option<Instant>, F> {
    DEADLINE.scope(deadline, f)
}

/// The current request deadline, if the request has one.
pub fn current() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok().flatten()
}

/// How long a remote call may take now: `default`, capped by 90 % of the time
/// left before the request deadline (the rest is left for the reply to reach
/// the client). Zero when the deadline has passed.
pub fn budget(default: Duration) -> Duration {
    match current() {
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            default.min(left.mul_f64(0.9))
        }
        None => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn budget_is_capped_by_the_scope() {
        assert_eq!(budget(Duration::from_secs(5)), Duration::from_secs(5));
        let d = Instant::now() + Duration::from_millis(100);
        let b = scope(Some(d), async { budget(Duration::from_secs(5)) }).await;
        assert!(b <= Duration::from_millis(90), "{b:?}");
        let past = Instant::now() - Duration::from_millis(1);
        let b = scope(Some(past), async { budget(Duration::from_secs(5)) }).await;
        assert_eq!(b, Duration::ZERO);
        let b = scope(None, async { budget(Duration::from_secs(1)) }).await;
        assert_eq!(b, Duration::from_secs(1));
    }
}
