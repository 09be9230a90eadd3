//! `server.resident_limit` (notes/024): above it, the allocator's freed pages
//! go back to the kernel at once; below it they stay for reuse (the binary
//! ships with jemalloc's decay off, notes/025).
//!
//! Blocks deleted from the memory tier leave freed ("dirty") pages behind. With the limit far above the server's memory they stay resident
//! (the control); with a 1 MiB limit the watcher hands them back within a
//! few of its 20 ms rounds, so resident memory falls back to what is
//! allocated. The gap is read from the server's own `kvtier_allocator_*`
//! metrics.
mod common;

use bytes::Bytes;
use common::{ready, scrape, scrape_signed, serve_command};
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use std::process::Child;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

struct Served {
    child: Child,
    grpc: String,
    http: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(resident_limit: &str) -> (Served, tempfile::TempDir) {
    serve_with(resident_limit, None)
}

/// A server whose `_RJEM_MALLOC_CONF` is `conf` (unset for `None`).
fn serve_with(resident_limit: &str, conf: Option<&str>) -> (Served, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kvtier.toml");
    std::fs::write(
        &cfg,
        format!("[server]\nresident_limit = \"{resident_limit}\"\n[engine]\nmemory_capacity = \"64MiB\"\n"),
    )
    .unwrap();
    let mut cmd = serve_command();
    cmd.args(["--config", cfg.to_str().unwrap()]);
    match conf {
        Some(c) => cmd.env("_RJEM_MALLOC_CONF", c),
        None => cmd.env_remove("_RJEM_MALLOC_CONF"),
    };
    let mut child = cmd.spawn().unwrap();
    let r = ready(&mut child).expect("kvtier serve ready");
    let served = Served {
        grpc: r["grpc"][0].as_str().unwrap().to_string(),
        http: r["http"].as_str().unwrap().to_string(),
        child,
    };
    (served, dir)
}

/// Writes 48 distinct 1 MiB blocks into the 64 MiB tier, then deletes
/// them: 48 MiB of pages freed at once, none of them needed again.
async fn churn(grpc: &str) {
    let c = Client::connect(ClientConfig::new(format!("grpc://{grpc}")))
        .await
        .unwrap();
    let keys: Vec<Key> = (0..48u32)
        .map(|i| Key::new(Bytes::from(format!("churn-{i:04}"))).unwrap())
        .collect();
    for (i, key) in keys.iter().enumerate() {
        let block = WriteBlock {
            token_ids: Vec::new(),
            key: key.clone(),
            parent: None,
            token_count: 0,
            payload: Bytes::from(vec![i as u8; MIB as usize]),
            ttl_ms: 0,
        };
        c.write("n", &[block]).await.unwrap();
    }
    for key in &keys {
        c.delete("n", std::slice::from_ref(key)).await.unwrap();
    }
}

/// Resident bytes the allocator holds beyond its live allocations.
fn kept(http: &str) -> u64 {
    let resident = scrape(http, "kvtier_allocator_resident_bytes ", &[]);
    let allocated = scrape(http, "kvtier_allocator_allocated_bytes ", &[]);
    assert!(resident > 0 && allocated > 0, "allocator metrics missing");
    resident.saturating_sub(allocated)
}

#[tokio::test]
async fn freed_pages_are_handed_back_above_the_resident_limit() {
    // The control: a limit no test server reaches. The freed pages stay.
    let (s, _d) = serve("64GiB");
    churn(&s.grpc).await;
    assert!(
        kept(&s.http) >= 32 * MIB,
        "without the limit, evicted blocks' pages should stay resident: {} MiB kept",
        kept(&s.http) / MIB
    );
    assert_eq!(scrape(&s.http, "kvtier_allocator_purges_total ", &[]), 0);
    drop(s);

    // 1 MiB: always above it, so the watcher purges every round.
    let (s, _d) = serve("1MiB");
    churn(&s.grpc).await;
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let k = kept(&s.http);
        if k < 8 * MIB {
            break;
        }
        assert!(
            Instant::now() < end,
            "freed pages still resident 5 s after the writes: {} MiB",
            k / MIB
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(scrape(&s.http, "kvtier_allocator_purges_total ", &[]) > 0);
}

/// The binary ships with jemalloc's page decay off (`malloc_conf` in
/// main.rs, notes/025): freed pages wait for the next block instead of
/// being handed back and faulted in again, bounded by the watcher above.
/// An operator's `_RJEM_MALLOC_CONF` still overrides it.
#[tokio::test]
async fn the_binary_keeps_freed_pages_for_reuse_unless_told_otherwise() {
    let (s, _d) = serve_with("64GiB", None);
    let decay = scrape_signed(&s.http, "kvtier_allocator_dirty_decay_ms ", &[]);
    drop(s);
    let (s, _d) = serve_with("64GiB", Some("dirty_decay_ms:10000,muzzy_decay_ms:0"));
    let overridden = scrape_signed(&s.http, "kvtier_allocator_dirty_decay_ms ", &[]);
    assert_eq!(
        (decay, overridden),
        (-1.0, 10_000.0),
        "dirty_decay_ms as shipped and under _RJEM_MALLOC_CONF"
    );
}
