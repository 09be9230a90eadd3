//! The load generator's engine: closed- and open-loop drivers, per-request
//! samples and their aggregation into [`RepeatInput`], generator CPU time and
//! the live progress line.
//!
//! Measurement window: a request counts when its unit *started* (closed loop:
//! was sent; open loop: was scheduled) inside `[warm_end, end)`. Units started
//! before `end` are drained and kept, so slow requests at the end of a step are
//! not cut off (in open loop that would hide exactly the stalls the correction
//! is for). Workers start no new unit after `end`.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::analysis::co::{RequestTiming, co_histograms};
use crate::builder::{OpInput, RepeatInput, new_histogram, record_us};
use crate::record::{Percentiles, Phase};

/// Server-reported timing of one request, µs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerTimes {
    /// Accepted → started (`None` when the API does not report it).
    pub queue_us: Option<u64>,
    /// Started → done (the compat API reports only the total: service = total there).
    pub service_us: u64,
    /// Time inside the storage tiers.
    pub storage_us: u64,
    /// Arrival → response ready.
    pub total_us: u64,
}

/// One request as the generator saw it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Operation name (`lookup`, `read`, `write`, `get`, `set`, `exists`).
    pub op: &'static str,
    /// When it was sent.
    pub sent: Instant,
    /// When its response completed.
    pub done: Instant,
    /// Server timing, if the API reports it.
    pub server: Option<ServerTimes>,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Tokens covered by the blocks moved.
    pub tokens: u64,
    /// Whether it failed.
    pub error: bool,
    /// Whether it failed because the server shed it (UNAVAILABLE): the
    /// worker backs off before its next unit, as a client would.
    pub shed: bool,
}

/// A unit of work: one request, or a dependent sequence (a conversation iteration).
pub trait Unit: Send + 'static {
    /// Runs one unit, appending one sample per request to `out`.
    fn run(&mut self, out: &mut Vec<Sample>) -> impl Future<Output = ()> + Send;
}

fn us(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

/// Aggregates samples of one repeat in one process.
pub struct Collector {
    open: bool,
    base: Instant,
    ops: BTreeMap<&'static str, OpInput>,
    timings: BTreeMap<&'static str, Vec<RequestTiming>>,
    all_e2e: Histogram<u64>,
    count: u64,
}

impl Collector {
    fn new(open: bool, base: Instant) -> Self {
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
    fn add_unit(&mut self, intended: Option<Instant>, samples: &[Sample]) {
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
    fn finish(mut self) -> (BTreeMap<String, OpInput>, Option<Histogram<u64>>) {
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

/// Live progress: a `\r`-overwritten line on a TTY, plain lines otherwise.
#[derive(Clone)]
pub struct Progress {
    tty: bool,
    quiet: bool,
}

impl Progress {
    /// Detects whether stdout is a terminal; `quiet` prints nothing.
    pub fn new(quiet: bool) -> Self {
        Progress {
            tty: std::io::stdout().is_terminal(),
            quiet,
        }
    }

    fn live(&self, label: &str, elapsed: Duration, ops_s: f64, p99_us: u64) {
        if self.quiet || !self.tty {
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = write!(
            out,
            "\r\x1b[2K{label}  t={:.1}s  {ops_s:.0} ops/s  p99 {:.2} ms",
            elapsed.as_secs_f64(),
            p99_us as f64 / 1000.0
        );
        let _ = out.flush();
    }

    /// One line for a finished repeat (ends the live line on a TTY).
    pub fn done(&self, label: &str, r: &RepeatInput) {
        if self.quiet {
            return;
        }
        let secs = r.duration.as_secs_f64().max(1e-9);
        let parts: Vec<String> = r
            .ops
            .iter()
            .map(|(name, op)| {
                let p = op
                    .phases
                    .get(&Phase::E2e)
                    .map(Percentiles::from_histogram)
                    .unwrap_or_default();
                format!(
                    "{name} {:.0} ops/s p50 {:.2} ms p99 {:.2} ms{}",
                    op.ops as f64 / secs,
                    p.p50 / 1000.0,
                    p.p99 / 1000.0,
                    if op.errors > 0 {
                        format!(" ({} errors)", op.errors)
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        let mut out = std::io::stdout().lock();
        let cr = if self.tty { "\r\x1b[2K" } else { "" };
        let _ = writeln!(
            out,
            "{cr}{label}: {}  cpu {:.0}%",
            parts.join("; "),
            100.0 * r.generator_cpu.as_secs_f64() / (secs * f64::from(r.generator_cores.max(1)))
        );
        let _ = out.flush();
    }
}

/// How load is applied in one repeat of one process.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub enum Load {
    /// `n` workers back to back.
    Closed(u32),
    /// Units scheduled at `rate` per second, served by a pool of `pool` workers
    /// (a unit waits for a free worker: that wait is client queue).
    Open {
        /// Units per second.
        rate: f64,
        /// Workers (connections / in-flight units at most).
        pool: u32,
    },
}

/// Runs one repeat with `workers` (closed loop: all of them; open loop: the pool).
/// Returns the repeat's raw results (CPU filled by `cpu`, called before and after).
pub async fn run_repeat<U: Unit>(
    workers: Vec<U>,
    load: Load,
    warmup: Duration,
    duration: Duration,
    progress: &Progress,
    label: &str,
    cpu: &(dyn Fn() -> Duration + Sync),
) -> anyhow::Result<(RepeatInput, Vec<U>)> {
    let start = Instant::now();
    let w = Window {
        start,
        warm_end: start + warmup,
        end: start + warmup + duration,
    };
    let open = matches!(load, Load::Open { .. });
    let col = Arc::new(Mutex::new(Collector::new(open, w.warm_end)));
    // Open loop: units due (intended start passed) minus units completed, so a
    // unit still waiting for a free worker counts as in flight.
    let completed = Arc::new(AtomicI64::new(0));
    let ticker = spawn_ticker(col.clone(), progress.clone(), label.to_string(), w);
    let sampler = match load {
        Load::Open { rate, .. } => Some(spawn_in_flight_sampler(rate, completed.clone(), w)),
        Load::Closed(_) => None,
    };
    // CPU is read at the start of the window.
    let cpu0 = Arc::new(Mutex::new(None::<Duration>));
    let cpu_task = {
        let cpu0 = cpu0.clone();
        async move {
            tokio::time::sleep_until(w.warm_end.into()).await;
            *cpu0.lock().expect("cpu") = Some(cpu());
        }
    };
    let workers = match load {
        Load::Closed(_) => {
            let (workers, ()) = tokio::join!(closed_loop(workers, col.clone(), w), cpu_task);
            workers
        }
        Load::Open { rate, .. } => {
            let (workers, ()) = tokio::join!(
                open_loop(workers, rate, col.clone(), completed, w),
                cpu_task
            );
            workers?
        }
    };
    let cpu1 = cpu();
    ticker.abort();
    let _ = ticker.await;
    let mean_in_flight = match sampler {
        Some(t) => t.join().map_err(|_| anyhow::anyhow!("sampler panicked"))?,
        None => None,
    };
    let generator_cpu = cpu1.saturating_sub(cpu0.lock().expect("cpu").unwrap_or(cpu1));
    let col = Arc::try_unwrap(col)
        .map_err(|_| anyhow::anyhow!("collector still shared"))?
        .into_inner()
        .expect("collector");
    let (ops, schedule_lag) = col.finish();
    let r = RepeatInput {
        duration,
        generator_cpu,
        generator_cores: cores(),
        schedule_lag: if open { schedule_lag } else { None },
        mean_in_flight: if open { mean_in_flight } else { None },
        ops,
    };
    Ok((r, workers))
}

/// The times of one repeat: start, end of warm-up, end.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    warm_end: Instant,
    end: Instant,
}

/// Live progress every 500 ms until the window ends.
fn spawn_ticker(
    col: Arc<Mutex<Collector>>,
    progress: Progress,
    label: String,
    w: Window,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = Instant::now();
            if now >= w.end {
                break;
            }
            let (count, p99) = {
                let c = col.lock().expect("collector");
                (c.count, c.all_e2e.value_at_quantile(0.99))
            };
            let el = now.saturating_duration_since(w.warm_end);
            let rate = if el > Duration::ZERO {
                count as f64 / el.as_secs_f64()
            } else {
                0.0
            };
            progress.live(&label, el, rate, p99);
        }
    })
}

/// Open loop: samples (units due − units completed) every 500 µs of the
/// measured window, on an OS thread; its mean is the in-flight figure for
/// Little's law.
fn spawn_in_flight_sampler(
    rate: f64,
    completed: Arc<AtomicI64>,
    w: Window,
) -> std::thread::JoinHandle<Option<f64>> {
    let due = move |now: Instant| -> i64 {
        if now < w.start {
            return 0;
        }
        let d = ((now - w.start).as_secs_f64() * rate).floor() as i64 + 1;
        d.min((w.end.duration_since(w.start).as_secs_f64() * rate).ceil() as i64)
    };
    std::thread::spawn(move || {
        let (mut sum, mut n) = (0i64, 0u64);
        loop {
            std::thread::sleep(Duration::from_micros(500));
            let now = Instant::now();
            if now >= w.end {
                break;
            }
            if now >= w.warm_end {
                sum += due(now) - completed.load(Ordering::Relaxed);
                n += 1;
            }
        }
        (n > 0).then(|| sum as f64 / n as f64)
    })
}

/// Closed loop: every worker runs units back to back until the window ends.
async fn closed_loop<U: Unit>(workers: Vec<U>, col: Arc<Mutex<Collector>>, w: Window) -> Vec<U> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut worker) in workers.into_iter().enumerate() {
        let col = col.clone();
        tasks.spawn(async move {
            let mut buf = Vec::new();
            while Instant::now() < w.end {
                buf.clear();
                worker.run(&mut buf).await;
                if buf.iter().any(|s| s.shed) {
                    // A shed request: back off like a client would.
                    tokio::time::sleep(kvtier_client::backoff(0)).await;
                }
                if let Some(first) = buf.first()
                    && first.sent >= w.warm_end
                    && first.sent < w.end
                {
                    col.lock().expect("collector").add_unit(None, &buf);
                }
            }
            (i, worker)
        });
    }
    let mut back: Vec<(usize, U)> = tasks.join_all().await;
    back.sort_by_key(|(i, _)| *i);
    back.into_iter().map(|(_, w)| w).collect()
}

/// Open loop: units start on a fixed schedule (`rate` per second) on the
/// first free worker; latency counts from the intended start.
async fn open_loop<U: Unit>(
    workers: Vec<U>,
    rate: f64,
    col: Arc<Mutex<Collector>>,
    completed: Arc<AtomicI64>,
    w: Window,
) -> anyhow::Result<Vec<U>> {
    anyhow::ensure!(rate > 0.0, "open-loop rate must be > 0");
    let pool_n = workers.len();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<U>(pool_n.max(1));
    for worker in workers {
        tx.send(worker).await.expect("pool has room");
    }
    // The schedule runs on an OS thread: its sleeps are precise to tens of
    // µs, where Tokio's timer rounds up to whole milliseconds.
    let sched = {
        let tx = tx.clone();
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let interval = 1.0 / rate;
            let mut tasks = Vec::new();
            for i in 0u64.. {
                let intended = w.start + Duration::from_secs_f64(i as f64 * interval);
                if intended >= w.end {
                    break;
                }
                let now = Instant::now();
                if intended > now {
                    std::thread::sleep(intended - now);
                }
                let measured = intended >= w.warm_end;
                // Waiting for a free worker is the coordinated-omission case.
                let Some(mut worker) = rx.blocking_recv() else {
                    break;
                };
                let col = col.clone();
                let completed = completed.clone();
                let tx = tx.clone();
                tasks.push(handle.spawn(async move {
                    let mut buf = Vec::new();
                    worker.run(&mut buf).await;
                    completed.fetch_add(1, Ordering::Relaxed);
                    if measured {
                        col.lock()
                            .expect("collector")
                            .add_unit(Some(intended), &buf);
                    }
                    let _ = tx.send(worker).await;
                }));
            }
            (rx, tasks)
        })
    };
    let (mut rx, tasks) = sched.await?;
    for t in tasks {
        t.await?;
    }
    drop(tx);
    let mut back = Vec::with_capacity(pool_n);
    while back.len() < pool_n {
        match rx.recv().await {
            Some(worker) => back.push(worker),
            None => break,
        }
    }
    Ok(back)
}

/// Cores available to this process.
pub fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// CPU time of this process's threads whose name starts with `prefix`
/// (all threads when `None`), from `/proc/self/task/*/schedstat` (ns; falls back
/// to `stat` utime + stime at USER_HZ = 100).
pub fn thread_cpu(prefix: Option<&str>) -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let mut total = Duration::ZERO;
    for e in dir.flatten() {
        let p = e.path();
        if let Some(pre) = prefix {
            let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
            if !comm.trim_end().starts_with(pre) {
                continue;
            }
        }
        if let Some(ns) = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            total += Duration::from_nanos(ns);
        } else if let Ok(stat) = std::fs::read_to_string(p.join("stat")) {
            // Fields after the parenthesised comm: state is field 3; utime, stime are 14, 15.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            total += Duration::from_millis((ticks(11) + ticks(12)) * 10);
        }
    }
    total
}

// ---- wire format for child processes --------------------------------------

/// A histogram as `(value, count)` pairs.
type WireHist = Vec<(u64, u64)>;

fn hist_to_wire(h: &Histogram<u64>) -> WireHist {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

fn hist_from_wire(w: &WireHist) -> Histogram<u64> {
    let mut h = new_histogram();
    for (v, c) in w {
        let _ = h.record_n(*v, *c);
    }
    h
}

#[derive(Serialize, Deserialize)]
struct WireOp {
    ops: u64,
    errors: u64,
    bytes: u64,
    tokens: u64,
    phases: BTreeMap<String, WireHist>,
    uncorrected: Option<WireHist>,
}

/// [`RepeatInput`] as JSON-friendly data (what a child process reports).
#[derive(Serialize, Deserialize)]
pub struct WireRepeat {
    duration_us: u64,
    cpu_us: u64,
    cores: u32,
    schedule_lag: Option<WireHist>,
    mean_in_flight: Option<f64>,
    ops: BTreeMap<String, WireOp>,
}

impl WireRepeat {
    /// Encodes.
    pub fn from_input(r: &RepeatInput) -> Self {
        WireRepeat {
            duration_us: us(r.duration),
            cpu_us: us(r.generator_cpu),
            cores: r.generator_cores,
            schedule_lag: r.schedule_lag.as_ref().map(hist_to_wire),
            mean_in_flight: r.mean_in_flight,
            ops: r
                .ops
                .iter()
                .map(|(k, o)| {
                    (
                        k.clone(),
                        WireOp {
                            ops: o.ops,
                            errors: o.errors,
                            bytes: o.bytes,
                            tokens: o.tokens,
                            phases: o
                                .phases
                                .iter()
                                .map(|(p, h)| (p.name().to_string(), hist_to_wire(h)))
                                .collect(),
                            uncorrected: o.e2e_uncorrected.as_ref().map(hist_to_wire),
                        },
                    )
                })
                .collect(),
        }
    }

    /// Decodes.
    pub fn into_input(self) -> anyhow::Result<RepeatInput> {
        let mut ops = BTreeMap::new();
        for (k, o) in self.ops {
            let mut phases = BTreeMap::new();
            for (p, h) in &o.phases {
                let phase = Phase::from_name(p).ok_or_else(|| anyhow::anyhow!("phase {p:?}"))?;
                phases.insert(phase, hist_from_wire(h));
            }
            ops.insert(
                k,
                OpInput {
                    ops: o.ops,
                    errors: o.errors,
                    bytes: o.bytes,
                    tokens: o.tokens,
                    phases,
                    e2e_uncorrected: o.uncorrected.as_ref().map(hist_from_wire),
                },
            );
        }
        Ok(RepeatInput {
            duration: Duration::from_micros(self.duration_us),
            generator_cpu: Duration::from_micros(self.cpu_us),
            generator_cores: self.cores,
            schedule_lag: self.schedule_lag.as_ref().map(hist_from_wire),
            mean_in_flight: self.mean_in_flight,
            ops,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake unit: sleeps `ms` and reports server time of half of it.
    struct Sleep(u64);
    impl Unit for Sleep {
        async fn run(&mut self, out: &mut Vec<Sample>) {
            let sent = Instant::now();
            tokio::time::sleep(Duration::from_millis(self.0)).await;
            out.push(Sample {
                op: "read",
                sent,
                done: Instant::now(),
                server: Some(ServerTimes {
                    queue_us: Some(10),
                    service_us: self.0 * 400,
                    storage_us: self.0 * 300,
                    total_us: self.0 * 500,
                }),
                bytes: 100,
                tokens: 128,
                error: false,
                shed: false,
            });
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_and_open_loops_fill_phases() {
        let p = Progress {
            tty: false,
            quiet: true,
        };
        let cpu = || thread_cpu(None);
        let (r, back) = run_repeat(
            vec![Sleep(2), Sleep(2)],
            Load::Closed(2),
            Duration::from_millis(20),
            Duration::from_millis(200),
            &p,
            "t",
            &cpu,
        )
        .await
        .unwrap();
        assert_eq!(back.len(), 2);
        let op = &r.ops["read"];
        assert!(op.ops > 50, "{}", op.ops);
        for ph in [
            Phase::E2e,
            Phase::Network,
            Phase::Storage,
            Phase::ServerQueue,
        ] {
            assert!(op.phases.contains_key(&ph), "{ph:?}");
        }
        // Round trip through the child wire format.
        let back = WireRepeat::from_input(&r).into_input().unwrap();
        assert_eq!(back.ops["read"].phases[&Phase::E2e].len(), op.ops);

        let (r, _) = run_repeat(
            vec![Sleep(2), Sleep(2)],
            Load::Open {
                rate: 200.0,
                pool: 2,
            },
            Duration::from_millis(20),
            Duration::from_millis(200),
            &p,
            "t",
            &cpu,
        )
        .await
        .unwrap();
        let op = &r.ops["read"];
        assert!((35..=45).contains(&op.ops), "{}", op.ops);
        assert!(op.e2e_uncorrected.is_some());
        assert!(op.phases.contains_key(&Phase::ClientQueue));
        assert!(r.mean_in_flight.is_some() && r.schedule_lag.is_some());
    }
}
