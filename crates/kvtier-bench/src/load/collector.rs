//! Aggregation of one repeat in one process: the [`Collector`] turns each
//! unit's samples into per-op histograms of every phase (server queue and
//! service, storage, network), counting errors without timing them; in open
//! loop it keeps the request timings and builds the coordinated-omission
//! corrected histograms at the end.

use std::collections::BTreeMap;
use std::time::Instant;

use hdrhistogram::Histogram;

use super::{Sample, us};
use crate::analysis::co::{RequestTiming, co_histograms};
use crate::builder::{OpInput, new_histogram, record_us};
use crate::record::Phase;

/// Aggregates samples of one repeat in one process.
pub struct Collector {
    open: bool,
    base: Instant,
    ops: BTreeMap<&'static str, OpInput>,
    timings: BTreeMap<&'static str, Vec<RequestTiming>>,
    /// End to end of all ops (the live p99).
    pub(super) all_e2e: Histogram<u64>,
    /// Samples so far (the live rate).
    pub(super) count: u64,
}

impl Collector {
    pub(super) fn new(open: bool, base: Instant) -> Self {
        Collector {
            open,
            base,
            ops: BTreeMap::new(),
            timings: BTreeMap::new(),
            all_e2e: new_histogram(),
            count: 0,
        }
    }

    /// Adds one unit's samples; `intended` is the scheduled start (open loop).
    pub(super) fn add_unit(&mut self, intended: Option<Instant>, samples: &[Sample]) {
        for (i, s) in samples.iter().enumerate() {
            let op = self.ops.entry(s.op).or_default();
            op.ops += 1;
            self.count += 1;
            if s.error {
                // Counted, not timed: latency figures are those of answered
                // requests (a shed request's fast refusal would flatter them).
                op.errors += 1;
                continue;
            }
            op.bytes += s.bytes;
            op.tokens += s.tokens;
            let actual = us(s.done.saturating_duration_since(s.sent));
            // Only the first request of a unit was scheduled; the rest follow it.
            let start = match intended {
                Some(t) if i == 0 => t.min(s.sent),
                _ => s.sent,
            };
            let e2e = us(s.done.saturating_duration_since(start));
            if self.open {
                self.timings.entry(s.op).or_default().push(RequestTiming {
                    intended_us: us(start.saturating_duration_since(self.base)),
                    sent_us: us(s.sent.saturating_duration_since(self.base)),
                    completed_us: us(s.done.saturating_duration_since(self.base)),
                });
            } else {
                op.record(Phase::E2e, e2e);
            }
            record_us(&mut self.all_e2e, e2e);
            if let Some(t) = s.server {
                if let Some(q) = t.queue_us {
                    op.record(Phase::ServerQueue, q);
                }
                op.record(Phase::ServerService, t.service_us);
                op.record(Phase::Storage, t.storage_us);
                op.record(Phase::Network, actual.saturating_sub(t.total_us));
            }
        }
    }

    /// The per-op inputs (open loop: corrected e2e, client queue and uncorrected e2e
    /// built with [`co_histograms`]) and the schedule-lag histogram of all ops.
    pub(super) fn finish(mut self) -> (BTreeMap<String, OpInput>, Option<Histogram<u64>>) {
        let mut lag: Option<Histogram<u64>> = None;
        for (name, t) in std::mem::take(&mut self.timings) {
            let h = co_histograms(&t);
            let op = self.ops.entry(name).or_default();
            op.phases.insert(Phase::E2e, h.corrected);
            op.phases.insert(Phase::ClientQueue, h.schedule_lag.clone());
            op.e2e_uncorrected = Some(h.uncorrected);
            let _ = lag.get_or_insert_with(new_histogram).add(&h.schedule_lag);
        }
        (
            self.ops
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            lag,
        )
    }
}
