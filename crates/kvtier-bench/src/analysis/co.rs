//! Coordinated-omission correction for open-loop runs.
//!
//! In an open-loop run every request has an *intended* start on a fixed
//! schedule. When the system stalls, a generator that waits for responses
//! (a connection, a permit, a slow send) sends late, and timing from the
//! actual send hides the stall: the requests that should have been in flight
//! during it are "omitted". Timing from the intended start counts that wait.
//! Both are recorded; the corrected one is the figure users see.

use hdrhistogram::Histogram;

use crate::builder::{new_histogram, record_us};

/// Timing of one request, microseconds on one monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTiming {
    /// When the schedule said it should start.
    pub intended_us: u64,
    /// When it was actually sent (≥ intended).
    pub sent_us: u64,
    /// When its response completed.
    pub completed_us: u64,
}

/// Corrected and uncorrected latency histograms of one open-loop run.
#[derive(Debug, Clone)]
pub struct CoHistograms {
    /// completed − intended: what a user on the schedule experiences.
    pub corrected: Histogram<u64>,
    /// completed − sent: what a naive generator reports.
    pub uncorrected: Histogram<u64>,
    /// sent − intended: how far the generator fell behind its schedule.
    pub schedule_lag: Histogram<u64>,
}

/// Builds the three histograms from per-request timings.
pub fn co_histograms(timings: &[RequestTiming]) -> CoHistograms {
    let mut h = CoHistograms {
        corrected: new_histogram(),
        uncorrected: new_histogram(),
        schedule_lag: new_histogram(),
    };
    for t in timings {
        record_us(
            &mut h.corrected,
            t.completed_us.saturating_sub(t.intended_us),
        );
        record_us(&mut h.uncorrected, t.completed_us.saturating_sub(t.sent_us));
        record_us(&mut h.schedule_lag, t.sent_us.saturating_sub(t.intended_us));
    }
    h
}

/// Simulates a generator on a fixed schedule that can have only one request
/// outstanding, against a server whose service time is `service_us(send_time)`.
/// Useful for tests and for explaining the correction.
pub fn simulate_single_connection(
    interval_us: u64,
    requests: u64,
    service_us: impl Fn(u64) -> u64,
) -> Vec<RequestTiming> {
    let mut free_at = 0;
    (0..requests)
        .map(|i| {
            let intended_us = i * interval_us;
            let sent_us = intended_us.max(free_at);
            let completed_us = sent_us + service_us(sent_us);
            free_at = completed_us;
            RequestTiming {
                intended_us,
                sent_us,
                completed_us,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Percentiles;

    #[test]
    fn stall_shows_in_corrected_not_uncorrected() {
        // 100 req/s for 100 s, 1 ms service, one 1 s stall of the request sent at t = 50 s.
        let stall_at = 50_000_000;
        let t = simulate_single_connection(10_000, 10_000, |sent| {
            if sent == stall_at { 1_000_000 } else { 1_000 }
        });
        let h = co_histograms(&t);
        let c = Percentiles::from_histogram(&h.corrected);
        let u = Percentiles::from_histogram(&h.uncorrected);
        // ~100 requests (1 %) were scheduled during the stall; corrected latency ramps from 1 s down.
        assert!(c.p99 > 5_000.0, "corrected p99 {c:?}");
        assert!(c.p999 > 800_000.0, "corrected p999 {c:?}");
        assert!(c.max >= 1_000_000.0);
        // Only one request saw the stall from its send.
        assert!(u.p99 <= 1_001.0, "uncorrected p99 {u:?}");
        assert!(u.p999 <= 1_001.0, "uncorrected p999 {u:?}");
        assert!(u.max >= 1_000_000.0);
        let lag = Percentiles::from_histogram(&h.schedule_lag);
        assert!(lag.max > 980_000.0 && lag.p50 == 0.0, "{lag:?}");
    }

    #[test]
    fn no_stall_no_difference() {
        let t = simulate_single_connection(10_000, 1_000, |_| 2_000);
        let h = co_histograms(&t);
        assert_eq!(
            Percentiles::from_histogram(&h.corrected),
            Percentiles::from_histogram(&h.uncorrected)
        );
    }
}
