//! What a running sweep shows: [`Progress`] prints a live line (rate and
//! p99 so far, every 500 ms, on a terminal) while a repeat runs and one line
//! per finished repeat.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Window;
use super::collector::Collector;
use crate::builder::RepeatInput;
use crate::record::{Percentiles, Phase};

/// Live progress: a `\r`-overwritten line on a TTY, plain lines otherwise.
#[derive(Clone)]
pub struct Progress {
    pub(super) tty: bool,
    pub(super) quiet: bool,
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

/// Live progress every 500 ms until the window ends.
pub(super) fn spawn_ticker(
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
