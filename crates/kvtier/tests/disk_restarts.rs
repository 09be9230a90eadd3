//! What survives a restart of the real binary with a disk tier
//! (docs/durability.md): SIGKILL mid-load under `--disk-sync always`, 20
//! times on one directory, loses no acknowledged block and leaves no torn or
//! corrupt record; after a graceful restart memory is empty, blocks are
//! served from disk and promoted, and the recovery is logged and exported.
mod common;

use common::disk::{NS, chain, key, log_field, payload_for, runtime, start, verify_chains};
use kvtier_client::Tier;
use kvtier_core::Key;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// SIGKILL mid-load under `--disk-sync always`, restart, verify every
/// acknowledged block, 20+ times on the same directory.
#[test]
fn sigkill_crash_loop_loses_no_acknowledged_block() {
    const CYCLES: u32 = 20;
    const WRITERS: u32 = 4;
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    let args = [
        "--disk-sync",
        "always",
        "--memory-capacity",
        "1MiB",
        "--max-block-size",
        "1MiB",
        "--disk-capacity",
        "4GiB",
    ];
    let rt = runtime();
    let mut acked: Vec<Vec<Key>> = Vec::new();
    let mut killed_in_flight = 0usize;
    let retried = Arc::new(AtomicUsize::new(0));
    let mut temp_files = 0u64;
    // Client retries (on UNAVAILABLE) are logged at debug level; shown on failure.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("kvtier_client=debug")
        .with_test_writer()
        .try_init();
    for cycle in 0..=CYCLES {
        let mut server = Some(start(&dir, &log, &args));
        let s = server.as_ref().unwrap();
        let recovered = log_field(&s.stderr(), "disk tier recovered", "blocks");
        let report = (
            s.metric("kvtier_disk_recovered_blocks"),
            s.metric("kvtier_disk_recovery_dropped_files{reason=\"torn\"}"),
            s.metric("kvtier_disk_recovery_dropped_files{reason=\"corrupt\"}"),
        );
        // A SIGKILL can leave temp files, never torn or corrupt records.
        assert_eq!(
            (report.1, report.2),
            (0.0, 0.0),
            "cycle {cycle}: recovery dropped records:\n{}",
            s.stderr()
        );
        temp_files += s.metric("kvtier_disk_recovery_dropped_files{reason=\"temp_file\"}") as u64;
        let acked_blocks: usize = acked.iter().map(Vec::len).sum();
        assert!(
            report.0 as usize >= acked_blocks,
            "cycle {cycle}: recovered {report:?} < {acked_blocks} acked"
        );
        assert_eq!(
            recovered,
            Some(report.0 as u64),
            "the log reports the recovery"
        );
        rt.block_on(async {
            let client = server.as_ref().unwrap().client().await;
            // Everything acknowledged in any earlier cycle is present and intact.
            let n = verify_chains(&client, &acked, &format!("cycle {cycle}")).await;
            assert_eq!(n, acked_blocks);
            if cycle == CYCLES {
                return;
            }
            // Write load from several tasks; SIGKILL after a cycle-dependent number of acks.
            let target = 3 + (cycle as usize * 7) % 13;
            let acks = Arc::new(AtomicUsize::new(0));
            let reached = Arc::new(tokio::sync::Notify::new());
            let killed = Arc::new(AtomicBool::new(false));
            let new_acked = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for w in 0..WRITERS {
                let (client, acks, reached, killed, new_acked, retried) = (
                    client.clone(),
                    acks.clone(),
                    reached.clone(),
                    killed.clone(),
                    new_acked.clone(),
                    retried.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    for i in 0u32.. {
                        let len = 1 + (cycle + w + i) % 3;
                        let keys: Vec<Key> = (0..len).map(|p| key(&[cycle, w, i, p])).collect();
                        match client.write(NS, &chain(&keys)).await {
                            Ok(r) => {
                                // Fresh keys: all stored, unless the client retried a
                                // request whose first attempt stored some of them.
                                assert_eq!(r.stored + r.existing, len);
                                if r.existing > 0 {
                                    retried.fetch_add(1, Ordering::Relaxed);
                                }
                                new_acked.lock().unwrap().push(keys);
                                if acks.fetch_add(1, Ordering::SeqCst) + 1 == target {
                                    reached.notify_one();
                                }
                            }
                            Err(e) => {
                                assert!(
                                    killed.load(Ordering::SeqCst),
                                    "write failed before the kill: {e}"
                                );
                                return;
                            }
                        }
                    }
                }));
            }
            reached.notified().await;
            killed.store(true, Ordering::SeqCst);
            server.take().unwrap().kill9();
            for t in &tasks {
                t.abort();
            }
            for t in tasks {
                if let Err(e) = t.await {
                    assert!(e.is_cancelled(), "writer panicked: {e}");
                    killed_in_flight += 1;
                }
            }
            acked.extend(new_acked.lock().unwrap().drain(..));
        });
        if let Some(s) = server {
            s.stop();
        }
    }
    let blocks: usize = acked.iter().map(Vec::len).sum();
    eprintln!(
        "{CYCLES} SIGKILL cycles: {} acknowledged writes ({blocks} blocks) all intact, {killed_in_flight} writers killed mid-write, \
         {temp_files} interrupted .tmp records removed at restarts, {} writes acknowledged after a client retry, {:?}",
        acked.len(),
        retried.load(Ordering::Relaxed),
        t0.elapsed()
    );
    assert!(blocks >= CYCLES as usize * 3);
}

/// After a restart memory is empty: lookups report TIER_DISK, reads promote,
/// and the recovery report is logged and exported.
#[test]
fn warm_restart_serves_from_disk_and_reports_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disk");
    let log = tmp.path().join("server.log");
    let args = ["--disk-sync", "batch", "--memory-capacity", "64MiB"];
    let keys: Vec<Key> = (0..6).map(|i| key(&[5, i])).collect();
    let s = start(&dir, &log, &args);
    assert_eq!(s.metric("kvtier_disk_recovered_blocks"), 0.0);
    let rt = runtime();
    rt.block_on(async {
        let c = s.client().await;
        c.write(NS, &chain(&keys)).await.unwrap();
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert!(l.tiers.iter().all(|t| *t == Tier::Memory), "{:?}", l.tiers);
    });
    s.stop();
    let s = start(&dir, &log, &args);
    let text = s.stderr();
    assert_eq!(
        log_field(&text, "disk tier recovered", "blocks"),
        Some(keys.len() as u64),
        "{text}"
    );
    assert!(
        log_field(&text, "disk tier recovered", "elapsed_ms").is_some(),
        "{text}"
    );
    assert_eq!(s.metric("kvtier_disk_recovered_blocks"), keys.len() as f64);
    assert!(s.metric("kvtier_disk_recovery_seconds") >= 0.0);
    assert_eq!(s.metric("kvtier_tier_blocks{tier=\"memory\"}"), 0.0);
    rt.block_on(async {
        let c = s.client().await;
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert_eq!(l.found, keys.len());
        assert!(l.tiers.iter().all(|t| *t == Tier::Disk), "{:?}", l.tiers);
        let r = c.read(NS, &keys, 0).await.unwrap();
        assert_eq!(r.blocks.len(), keys.len());
        for (b, k) in r.blocks.iter().zip(&keys) {
            assert_eq!(b.tier, Tier::Disk);
            assert!(b.payload == payload_for(k.as_bytes()));
        }
        // Disk hits were promoted.
        let l = c.lookup(NS, &keys, None).await.unwrap();
        assert!(l.tiers.iter().all(|t| *t == Tier::Memory), "{:?}", l.tiers);
    });
    s.stop();
}
