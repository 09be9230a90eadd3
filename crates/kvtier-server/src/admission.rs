//! How many requests a front serves at once (docs/operations.md, "Load
//! shedding").
//!
//! Two modes, `server.concurrency_limit`:
//!
//! * `static`: at most `server.max_inflight` in service; the rest wait in a
//!   queue of at most `server.max_queued` for at most `server.queue_timeout`,
//!   then are shed.
//! * `adaptive`: the limit follows measured service latency, so the server
//!   sheds at its knee instead of queueing past it. The controller is a
//!   gradient controller after Envoy's adaptive-concurrency filter
//!   (envoyproxy.io, "Adaptive Concurrency"): `min_rtt` is the median service
//!   time of `MIN_RTT_SAMPLES` requests served one at a time (measured at
//!   start and every `MIN_RTT_INTERVAL`, the limit held at 1 meanwhile);
//!   every `WINDOW` the median service time of the window, `sample`, moves
//!   the limit:
//!
//!   ```text
//!   gradient = clamp(min_rtt · (1 + BUFFER) / sample, 0.5, 2)
//!   gradient < 1:  limit = limit · gradient                  (multiplicative decrease)
//!   gradient ≥ 1:  limit = limit + clamp(limit · (gradient − 1), 1, √limit)
//!   ```
//!
//!   A request past the limit is refused at once (no queue: waiting is what
//!   the limit exists to prevent). On a server that serves `k` requests in
//!   parallel and shares its capacity past that, service time at `n > k` is
//!   `n / k · min_rtt`, so the limit settles near `(1 + BUFFER) · k`: past
//!   the knee (throughput at its peak) with latency within `1 + BUFFER` of
//!   the unloaded one. Departures from Envoy, measured in notes/012: the
//!   increase is additive near the target (Envoy adds `√limit` always, which
//!   settles at 2–3× the knee on a small `k`), `min_rtt` is measured at
//!   concurrency 1 rather than 3, and, as in Netflix's concurrency-limits,
//!   the limit only grows while at least half of it was used in the window
//!   (an idle server keeps a limit it has shown it can serve instead of
//!   drifting to the maximum).
//!
//! Each front (gRPC, HTTP, data plane) has its own limiter: their costs differ
//! per request, and one front's overload does not shut out the others.
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `server.concurrency_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `server.max_inflight`, with a bounded queue.
    Static,
    /// Follows measured latency, at most `server.max_inflight`.
    Adaptive,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "static" => Ok(Mode::Static),
            "adaptive" => Ok(Mode::Adaptive),
            other => Err(format!("{other:?}: expected \"static\" or \"adaptive\"")),
        }
    }
}

/// Length of one sampling window.
pub const WINDOW: Duration = Duration::from_millis(100);
/// How often `min_rtt` is measured again (Envoy's default 60 s, ± 15 %).
pub const MIN_RTT_INTERVAL: Duration = Duration::from_secs(60);
/// Requests sampled for one `min_rtt` measurement.
pub const MIN_RTT_SAMPLES: usize = 50;
/// The limit while `min_rtt` is measured.
pub const PROBE_CONCURRENCY: usize = 1;
/// The lowest the limit goes otherwise.
pub const MIN_CONCURRENCY: usize = 2;
/// Latency above `min_rtt` tolerated before the limit shrinks.
pub const BUFFER: f64 = 0.25;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue (static mode) is full.
    QueueFull,
    /// No capacity within `server.queue_timeout` (static mode).
    Timeout,
    /// At the adaptive limit.
    AtLimit,
    /// Waited in its socket, before the server read it, longer than the
    /// limit allows (data plane and gRPC; [`Limiter::too_late`]).
    Late,
}

/// Least time a request may wait in its socket before the adaptive limit
/// refuses it (see [`Limiter::too_late`]). At the knee a request waits about
/// one service time; at 0.5 ms the data plane refused ~1 in 8 requests of
/// two clients (notes/029), so the floor is 1 ms (notes/030).
pub const SOJOURN_FLOOR: Duration = Duration::from_millis(1);

/// How many unloaded service times (`min_rtt`) a request may wait in its
/// socket under the adaptive limit: as long as it would behind the
/// [`MIN_CONCURRENCY`] requests the limit always admits. Not the current
/// limit: over gRPC a reply counts as served once HTTP/2 has buffered it, so
/// the limit grows past what the core serves (to 11–14 at 10× the knee),
/// and a sojourn bound tied to it let requests wait 5 ms (notes/030).
pub const SOJOURN_RTTS: u64 = MIN_CONCURRENCY as u64;

/// A request's place in service; gives it back (and, adaptive, reports the
/// service time) when dropped.
pub struct Permit {
    inner: PermitInner,
}

enum PermitInner {
    Static(#[allow(dead_code)] OwnedSemaphorePermit),
    Adaptive {
        limiter: Arc<Adaptive>,
        started: Instant,
        probe: bool,
    },
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let PermitInner::Adaptive {
            limiter,
            started,
            probe,
        } = &self.inner
        {
            limiter.release(started.elapsed(), *probe);
        }
    }
}

/// The concurrency limit of one front.
pub struct Limiter {
    kind: Kind,
}

enum Kind {
    Static(Fixed),
    Adaptive(Arc<Adaptive>),
}

/// `server.max_inflight` in service, then a bounded queue.
struct Fixed {
    permits: Arc<Semaphore>,
    max: usize,
    /// `server.max_queued`.
    max_queued: usize,
    /// `server.queue_timeout`.
    queue_timeout: Duration,
    /// Requests waiting now.
    waiting: AtomicUsize,
}

impl Limiter {
    /// A static limit of `max` with a queue of `max_queued` waiting at most `timeout`.
    pub fn fixed(max: usize, max_queued: usize, timeout: Duration) -> Self {
        let max = max.max(1);
        Self {
            kind: Kind::Static(Fixed {
                permits: Arc::new(Semaphore::new(max)),
                max,
                max_queued,
                queue_timeout: timeout,
                waiting: AtomicUsize::new(0),
            }),
        }
    }

    /// An adaptive limit of at most `max`; `gauge` shows the current limit.
    pub fn adaptive(max: usize, gauge: Gauge) -> Self {
        Self {
            kind: Kind::Adaptive(Arc::new(Adaptive::new(max, gauge, Instant::now()))),
        }
    }

    /// From the configuration.
    pub fn from_config(
        mode: Mode,
        max: usize,
        max_queued: usize,
        timeout: Duration,
        gauge: Gauge,
    ) -> Self {
        match mode {
            Mode::Static => {
                gauge.set(max as i64);
                Self::fixed(max, max_queued, timeout)
            }
            Mode::Adaptive => Self::adaptive(max, gauge),
        }
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        match &self.kind {
            Kind::Static(f) => f.max,
            Kind::Adaptive(a) => a.limit.load(Ordering::Relaxed),
        }
    }

    /// Requests in service now.
    pub fn inflight(&self) -> usize {
        match &self.kind {
            Kind::Static(f) => f.max - f.permits.available_permits(),
            Kind::Adaptive(a) => a.inflight.load(Ordering::Relaxed),
        }
    }

    /// Requests waiting for admission now (static mode).
    pub fn queued(&self) -> usize {
        match &self.kind {
            Kind::Static(f) => f.waiting.load(Ordering::Relaxed),
            Kind::Adaptive(_) => 0,
        }
    }

    /// The queue timeout, the base of the retry hint.
    pub fn retry_hint(&self) -> Duration {
        match &self.kind {
            Kind::Static(f) => f.queue_timeout,
            // A few windows: long enough for the limit to have moved.
            Kind::Adaptive(_) => WINDOW * 2,
        }
    }

    /// Whether a request that already waited `waited` before the server
    /// could read it (known from the kernel's receive timestamp) is refused instead of served. Static: past
    /// `server.queue_timeout`, the most queueing it allows. Adaptive: past
    /// [`SOJOURN_RTTS`] × `min_rtt` (at least [`SOJOURN_FLOOR`]), once
    /// `min_rtt` is known.
    /// This is where the data plane's queue forms (notes/028): a request
    /// waits in its socket, not for admission.
    pub fn too_late(&self, waited: Duration) -> bool {
        match &self.kind {
            Kind::Static(f) => waited > f.queue_timeout,
            Kind::Adaptive(a) => {
                let min_rtt = a.min_rtt_ns.load(Ordering::Relaxed);
                min_rtt > 0 && {
                    let target = Duration::from_nanos(min_rtt.saturating_mul(SOJOURN_RTTS));
                    waited > target.max(SOJOURN_FLOOR)
                }
            }
        }
    }

    /// Admits a request now, after a bounded wait (static), or refuses it.
    pub async fn acquire(&self) -> Result<Permit, Refused> {
        match &self.kind {
            Kind::Adaptive(a) => a.try_acquire(Instant::now()).ok_or(Refused::AtLimit),
            Kind::Static(f) => {
                if let Ok(p) = f.permits.clone().try_acquire_owned() {
                    return Ok(Permit {
                        inner: PermitInner::Static(p),
                    });
                }
                let before = f.waiting.fetch_add(1, Ordering::Relaxed);
                let _slot = Slot(&f.waiting);
                if before >= f.max_queued {
                    return Err(Refused::QueueFull);
                }
                match tokio::time::timeout(f.queue_timeout, f.permits.clone().acquire_owned()).await
                {
                    Ok(p) => Ok(Permit {
                        inner: PermitInner::Static(p.expect("semaphore never closed")),
                    }),
                    Err(_) => Err(Refused::Timeout),
                }
            }
        }
    }
}

struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The adaptive limiter's shared state.
pub struct Adaptive {
    max: usize,
    inflight: AtomicUsize,
    limit: AtomicUsize,
    /// The last `min_rtt` measured, in ns (0: not yet).
    min_rtt_ns: AtomicU64,
    gauge: Gauge,
    /// Whether `min_rtt` is being measured (admissions count for it).
    probing: AtomicBool,
    /// Most requests in service at once during the current window.
    window_peak: AtomicUsize,
    state: Mutex<Gradient>,
}

struct Gradient {
    /// The limit as a real number (the atomic holds its ceiling).
    limit: f64,
    /// Latency at `PROBE_CONCURRENCY`; `None` until first measured.
    min_rtt: Option<Duration>,
    /// `Some(limit to restore)` while `min_rtt` is being measured.
    measuring: Option<f64>,
    probe_samples: Vec<Duration>,
    window: Vec<Duration>,
    window_start: Instant,
    next_min_rtt: Instant,
}

impl Adaptive {
    fn new(max: usize, gauge: Gauge, now: Instant) -> Self {
        let max = max.max(MIN_CONCURRENCY);
        gauge.set(PROBE_CONCURRENCY as i64);
        Self {
            max,
            inflight: AtomicUsize::new(0),
            // Starts by measuring min_rtt, like Envoy.
            limit: AtomicUsize::new(PROBE_CONCURRENCY),
            min_rtt_ns: AtomicU64::new(0),
            gauge,
            probing: AtomicBool::new(true),
            window_peak: AtomicUsize::new(0),
            state: Mutex::new(Gradient {
                limit: MIN_CONCURRENCY as f64,
                min_rtt: None,
                measuring: Some(MIN_CONCURRENCY as f64),
                probe_samples: Vec::with_capacity(MIN_RTT_SAMPLES),
                window: Vec::new(),
                window_start: now,
                next_min_rtt: now,
            }),
        }
    }

    /// Takes a place under the limit; whether it counts for `min_rtt`.
    fn try_admit(&self) -> Option<bool> {
        let limit = self.limit.load(Ordering::Relaxed);
        let prev = self
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        self.window_peak.fetch_max(prev + 1, Ordering::Relaxed);
        Some(self.probing.load(Ordering::Relaxed))
    }

    fn try_acquire(self: &Arc<Self>, now: Instant) -> Option<Permit> {
        let probe = self.try_admit()?;
        Some(Permit {
            inner: PermitInner::Adaptive {
                limiter: self.clone(),
                started: now,
                probe,
            },
        })
    }

    fn release(&self, took: Duration, probe: bool) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        self.record(took, probe, Instant::now());
    }

    /// Records one service time and moves the limit when a window closed.
    fn record(&self, took: Duration, probe: bool, now: Instant) {
        let mut g = self.state.lock();
        if let Some(restore) = g.measuring {
            if probe {
                g.probe_samples.push(took);
            }
            if g.probe_samples.len() >= MIN_RTT_SAMPLES {
                let mut s = std::mem::take(&mut g.probe_samples);
                let m = median(&mut s);
                g.min_rtt = Some(m);
                self.min_rtt_ns
                    .store(m.as_nanos().max(1) as u64, Ordering::Relaxed);
                g.measuring = None;
                self.probing.store(false, Ordering::Relaxed);
                g.limit = restore;
                g.window.clear();
                g.window_start = now;
                self.window_peak.store(0, Ordering::Relaxed);
                g.next_min_rtt = now + jitter(MIN_RTT_INTERVAL);
                self.publish(restore);
            }
            return;
        }
        g.window.push(took);
        if now.duration_since(g.window_start) < WINDOW {
            return;
        }
        let min_rtt = g.min_rtt.expect("measured before leaving the first probe");
        let sample = median(&mut g.window);
        g.window.clear();
        let peak = self.window_peak.swap(0, Ordering::Relaxed);
        g.window_start = now;
        let next = next_limit(g.limit, min_rtt, sample, peak, self.max);
        g.limit = next;
        if now >= g.next_min_rtt {
            g.measuring = Some(next);
            self.probing.store(true, Ordering::Relaxed);
            g.probe_samples.clear();
            self.limit.store(PROBE_CONCURRENCY, Ordering::Relaxed);
            self.gauge.set(PROBE_CONCURRENCY as i64);
        } else {
            self.publish(next);
        }
    }

    fn publish(&self, limit: f64) {
        let l = (limit.ceil() as usize).clamp(MIN_CONCURRENCY, self.max);
        self.limit.store(l, Ordering::Relaxed);
        self.gauge.set(l as i64);
    }
}

/// One step of the gradient controller (see the module comment).
pub fn next_limit(limit: f64, min_rtt: Duration, sample: Duration, peak: usize, max: usize) -> f64 {
    let target = min_rtt.as_secs_f64() * (1.0 + BUFFER);
    let gradient = (target / sample.as_secs_f64().max(1e-9)).clamp(0.5, 2.0);
    let next = if gradient < 1.0 {
        limit * gradient
    } else if (peak as f64) < limit / 2.0 {
        // An under-used limit is not raised: nothing showed it can be served.
        limit
    } else {
        limit + (limit * (gradient - 1.0)).clamp(1.0, limit.sqrt().max(1.0))
    };
    next.clamp(MIN_CONCURRENCY as f64, max as f64)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.85..1.15))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    #[test]
    fn the_gradient_moves_the_limit_toward_the_latency_target() {
        // Twice the target latency: halved.
        assert_eq!(next_limit(40.0, ms(1.0), ms(2.5), 40, 1000), 20.0);
        // Far past it: at most halved per window, never below the floor.
        assert_eq!(next_limit(40.0, ms(1.0), ms(100.0), 40, 1000), 20.0);
        assert_eq!(next_limit(2.0, ms(1.0), ms(100.0), 2, 1000), 2.0);
        // Just under the target: grows by one.
        assert_eq!(next_limit(16.0, ms(1.0), ms(1.24), 16, 1000), 17.0);
        // Well under it: grows by at most √limit, never past the maximum.
        assert_eq!(next_limit(16.0, ms(1.0), ms(0.5), 16, 1000), 20.0);
        assert_eq!(next_limit(1000.0, ms(1.0), ms(0.1), 1000, 64), 64.0);
    }

    #[test]
    fn an_unused_limit_does_not_grow() {
        assert_eq!(next_limit(100.0, ms(1.0), ms(0.5), 10, 1000), 100.0);
        assert!(next_limit(100.0, ms(1.0), ms(0.5), 60, 1000) > 100.0);
    }

    #[tokio::test]
    async fn past_the_adaptive_limit_requests_are_refused_at_once() {
        let l = Limiter::adaptive(100, Gauge::default());
        // It starts at the probe concurrency (1) to measure min_rtt.
        let held = l.acquire().await.expect("under the limit");
        assert_eq!(l.limit(), PROBE_CONCURRENCY);
        assert_eq!(l.acquire().await.err(), Some(Refused::AtLimit));
        drop(held);
        assert!(l.acquire().await.is_ok());
    }

    #[test]
    fn a_request_that_queued_in_its_socket_too_long_is_late() {
        // Static: past server.queue_timeout.
        let f = Limiter::fixed(4, 4, ms(100.0));
        assert!(!f.too_late(ms(99.0)));
        assert!(f.too_late(ms(101.0)));
        // Adaptive: nothing is late before min_rtt is known...
        let t0 = Instant::now();
        let a = Arc::new(Adaptive::new(1000, Gauge::default(), t0));
        let l = Limiter {
            kind: Kind::Adaptive(a.clone()),
        };
        assert!(!l.too_late(ms(1000.0)));
        for i in 0..MIN_RTT_SAMPLES {
            a.try_admit();
            a.inflight.fetch_sub(1, Ordering::AcqRel);
            a.record(ms(1.0), true, t0 + ms(i as f64));
        }
        // ...then past SOJOURN_RTTS × min_rtt: 2 × 1 ms here, whatever the limit.
        assert_eq!(l.limit(), MIN_CONCURRENCY);
        assert!(!l.too_late(ms(1.9)));
        assert!(l.too_late(ms(2.1)));
        a.limit.store(10, Ordering::Relaxed);
        assert!(
            l.too_late(ms(2.1)),
            "the bound does not grow with the limit"
        );
        // Never under the floor, whatever min_rtt.
        a.min_rtt_ns.store(1_000, Ordering::Relaxed);
        assert!(!l.too_late(SOJOURN_FLOOR));
        assert!(l.too_late(SOJOURN_FLOOR + ms(0.01)));
    }

    #[test]
    fn min_rtt_is_measured_first_and_the_limit_then_follows_latency() {
        let t0 = Instant::now();
        let a = Adaptive::new(1000, Gauge::default(), t0);
        for i in 0..MIN_RTT_SAMPLES {
            assert_eq!(a.try_admit(), Some(true), "probe admission {i}");
            assert_eq!(a.try_admit(), None, "one at a time while probing");
            a.inflight.fetch_sub(1, Ordering::AcqRel);
            a.record(ms(1.0), true, t0 + ms(i as f64));
        }
        assert_eq!(a.state.lock().min_rtt, Some(ms(1.0)));
        assert_eq!(a.limit.load(Ordering::Relaxed), MIN_CONCURRENCY);
        // Fast, fully used windows raise the limit; slow ones lower it.
        let mut now = t0 + ms(100.0);
        let mut window = |took: f64, a: &Adaptive| {
            let limit = a.limit.load(Ordering::Relaxed);
            for _ in 0..limit {
                assert_eq!(a.try_admit(), Some(false));
            }
            // One window closes with the last of them.
            for i in 0..limit {
                a.inflight.fetch_sub(1, Ordering::AcqRel);
                let at = if i + 1 == limit { now + WINDOW } else { now };
                a.record(ms(took), false, at);
            }
            now += WINDOW;
            a.limit.load(Ordering::Relaxed)
        };
        let mut last = MIN_CONCURRENCY;
        for _ in 0..5 {
            let l = window(0.9, &a);
            assert!(l > last, "{l} > {last}");
            last = l;
        }
        let l = window(5.0, &a);
        assert!(l < last, "{l} < {last}");
    }

    #[tokio::test]
    async fn a_static_queue_is_bounded_in_length_and_time() {
        let l = Arc::new(Limiter::fixed(1, 1, Duration::from_millis(50)));
        let first = l.acquire().await.expect("admitted");
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.acquire().await.map(|_| ()) });
        while l.queued() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(l.acquire().await.err(), Some(Refused::QueueFull));
        assert_eq!(waiter.await.unwrap().err(), Some(Refused::Timeout));
        drop(first);
        assert!(l.acquire().await.is_ok());
    }

    /// A server simulated in virtual time: it serves `k` requests in
    /// parallel, each needing `base` of work, and past `k` shares its
    /// capacity among all of them (processor sharing), so latency grows with
    /// concurrency past the knee. Closed-loop clients back off 10–20 ms
    /// (jittered, like the clients) when shed.
    struct Sim {
        k: f64,
        base: f64,
    }

    #[derive(Debug)]
    struct Outcome {
        ok: usize,
        shed: usize,
        p99: f64,
        secs: f64,
    }

    impl Outcome {
        fn throughput(&self) -> f64 {
            self.ok as f64 / self.secs
        }
    }

    impl Sim {
        /// `clients` for `secs` of virtual time, adaptive limit or none,
        /// measured over the second half.
        fn run(&self, clients: usize, secs: f64, adaptive: bool) -> Outcome {
            enum C {
                Serving {
                    left: f64,
                    started: f64,
                    probe: Option<bool>,
                },
                Waiting(f64),
            }
            let t0 = Instant::now();
            let lim = Adaptive::new(1000, Gauge::default(), t0);
            let dt = 10e-6;
            let from = secs / 2.0;
            let mut cs: Vec<C> = (0..clients).map(|_| C::Waiting(0.0)).collect();
            let (mut ok, mut shed, mut lat) = (0, 0, Vec::new());
            let mut now = 0.0;
            while now < secs {
                for c in cs.iter_mut() {
                    if let C::Waiting(at) = *c
                        && at <= now
                    {
                        let probe = if adaptive {
                            match lim.try_admit() {
                                Some(p) => Some(p),
                                None => {
                                    shed += usize::from(now >= from);
                                    *c = C::Waiting(now + rand::random_range(0.010..0.020));
                                    continue;
                                }
                            }
                        } else {
                            None
                        };
                        *c = C::Serving {
                            left: self.base,
                            started: now,
                            probe,
                        };
                    }
                }
                let serving = cs.iter().filter(|c| matches!(c, C::Serving { .. })).count();
                let rate = (self.k / serving.max(1) as f64).min(1.0);
                now += dt;
                for c in cs.iter_mut() {
                    if let C::Serving {
                        left,
                        started,
                        probe,
                    } = c
                    {
                        *left -= dt * rate;
                        if *left <= 0.0 {
                            let took = now - *started;
                            if let Some(p) = *probe {
                                lim.inflight.fetch_sub(1, Ordering::AcqRel);
                                lim.record(
                                    Duration::from_secs_f64(took),
                                    p,
                                    t0 + Duration::from_secs_f64(now),
                                );
                            }
                            if *started >= from {
                                ok += 1;
                                lat.push(took);
                            }
                            *c = C::Waiting(now);
                        }
                    }
                }
            }
            lat.sort_by(f64::total_cmp);
            let p99 = lat[(lat.len() * 99 / 100).min(lat.len() - 1)];
            Outcome {
                ok,
                shed,
                p99,
                secs: secs - from,
            }
        }
    }

    /// The overload target (docs/operations.md, "Admission and load
    /// shedding"; notes/031), on the model: at 10× the knee the adaptive limit
    /// sheds, admitted p99 stays within 2× the p99 at the knee and throughput
    /// within 90 % of the peak. Without a limit, p99 grows tenfold.
    #[test]
    fn at_ten_times_the_knee_the_adaptive_limit_sheds_and_keeps_latency() {
        for k in [2.0, 8.0] {
            let sim = Sim { k, base: 0.0005 };
            let knee = sim.run(k as usize, 2.0, false);
            let unlimited = sim.run(10 * k as usize, 2.0, false);
            let limited = sim.run(10 * k as usize, 2.0, true);
            assert!(
                unlimited.p99 > 5.0 * knee.p99,
                "k={k}: the model queues without a limit: {unlimited:?} vs {knee:?}"
            );
            assert!(limited.shed > 0, "k={k}: {limited:?}");
            assert!(
                limited.p99 <= 2.0 * knee.p99,
                "k={k}: admitted p99 {} > 2 × knee p99 {}",
                limited.p99,
                knee.p99
            );
            assert!(
                limited.throughput() >= 0.9 * knee.throughput(),
                "k={k}: throughput {} < 90 % of {}",
                limited.throughput(),
                knee.throughput()
            );
        }
    }
}
