//! The closed loop: a fixed number of workers, each starting its next unit
//! when the previous one completes (and backing off after a shed request),
//! until the measured window ends.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::collector::Collector;
use super::{Unit, Window};

/// Closed loop: every worker runs units back to back until the window ends.
pub(super) async fn closed_loop<U: Unit>(
    workers: Vec<U>,
    col: Arc<Mutex<Collector>>,
    w: Window,
) -> Vec<U> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut worker) in workers.into_iter().enumerate() {
        let col = col.clone();
        tasks.spawn(async move {
            let mut buf = Vec::new();
            while Instant::now() < w.end {
                buf.clear();
                worker.run(&mut buf).await;
                if let Some(pause) = buf.iter().filter_map(|s| s.shed).max() {
                    // A shed request: back off like a client would.
                    tokio::time::sleep(pause).await;
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
