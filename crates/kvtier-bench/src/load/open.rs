//! The open loop: units start on a fixed schedule, kept by an OS thread, on
//! the first free worker of a pool, and latency counts from the intended
//! start (a unit waiting for a worker is the coordinated-omission case). A
//! second thread samples the requests in flight for Little's law.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::collector::Collector;
use super::{Unit, Window};

/// Open loop: samples (units due − units completed) every 500 µs of the
/// measured window, on an OS thread; its mean is the in-flight figure for
/// Little's law.
pub(super) fn spawn_in_flight_sampler(
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

/// Open loop: units start on a fixed schedule (`rate` per second) on the
/// first free worker; latency counts from the intended start.
pub(super) async fn open_loop<U: Unit>(
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
