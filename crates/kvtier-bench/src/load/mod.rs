//! The load generator's engine: closed- and open-loop drivers, per-request
//! samples and their aggregation into [`RepeatInput`], generator CPU time and
//! the live progress line.
//!
//! Measurement window: a request counts when its unit *started* (closed loop:
//! was sent; open loop: was scheduled) inside `[warm_end, end)`. Units started
//! before `end` are drained and kept, so slow requests at the end of a step are
//! not cut off (in open loop that would hide exactly the stalls the correction
//! is for). Workers start no new unit after `end`.
//!
//! The parts: `collector` aggregates samples, `closed` and `open` are the two
//! loops, `progress` is the live output and `child_report` the child
//! processes' report (the child protocol). This file holds the vocabulary
//! they share ([`Sample`], [`Unit`], [`Load`]), [`run_repeat`], which runs
//! one repeat with either loop, and the generator's CPU accounting.

use std::future::Future;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::builder::RepeatInput;

mod child_report;
mod closed;
mod collector;
mod open;
mod progress;

pub use child_report::ChildReport;
pub use collector::Collector;
pub use progress::Progress;

use closed::closed_loop;
use open::{open_loop, spawn_in_flight_sampler};
use progress::spawn_ticker;

/// Server-reported timing of one request, µs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerTimes {
    /// Accepted → started (`None` when the API does not report it).
    pub queue_us: Option<u64>,
    /// Started → done (the kvstore API reports only the total: service = total there).
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
    /// When the server shed it (UNAVAILABLE): the pause before the worker's
    /// next unit, as a client would take it (the server's retry hint where
    /// it gave one: `kvtier_client::retry_pause`).
    pub shed: Option<std::time::Duration>,
}

/// A unit of work: one request, or a dependent sequence (a conversation iteration).
pub trait Unit: Send + 'static {
    /// Runs one unit, appending one sample per request to `out`.
    fn run(&mut self, out: &mut Vec<Sample>) -> impl Future<Output = ()> + Send;
}

fn us(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Phase;

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
                shed: None,
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
        // Round trip through the child protocol.
        let back = ChildReport::from_input(&r).into_input().unwrap();
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
