//! A built-in raw-TCP throughput probe (iperf-like): `streams` connections to
//! a loopback listener, each pushing 1 MiB writes for `duration`; the reader
//! side counts bytes. Gives the link ceiling the bandwidth tables compare to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::record::LinkProbe;

/// Measures loopback TCP throughput with `streams` parallel streams.
pub async fn loopback_probe(streams: u32, duration: Duration) -> anyhow::Result<LinkProbe> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let received = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let end = started + duration;
    let mut readers = tokio::task::JoinSet::new();
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..streams.max(1) {
        writers.spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            let buf = vec![0xA5u8; 1 << 20];
            while Instant::now() < end {
                s.write_all(&buf).await?;
            }
            s.shutdown().await?;
            anyhow::Ok(())
        });
        let (mut sock, _) = listener.accept().await?;
        let received = received.clone();
        readers.spawn(async move {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = sock.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                if Instant::now() <= end {
                    received.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        });
    }
    for r in writers.join_all().await {
        r?;
    }
    for r in readers.join_all().await {
        r?;
    }
    let secs = duration.as_secs_f64();
    Ok(LinkProbe {
        gbit_per_s: received.load(Ordering::Relaxed) as f64 * 8.0 / secs / 1e9,
        streams: streams.max(1),
        duration_s: secs,
        method: format!(
            "built-in loopback TCP probe: {} stream(s) of 1 MiB writes for {secs:.1} s (generator host; \
             not the client-server path when the target is remote)",
            streams.max(1)
        ),
    })
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probe_measures_something() {
        let p = super::loopback_probe(2, std::time::Duration::from_millis(200))
            .await
            .unwrap();
        assert!(p.gbit_per_s > 0.1, "{p:?}");
    }
}
