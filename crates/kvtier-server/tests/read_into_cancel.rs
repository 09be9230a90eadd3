//! A read into the caller's buffers that is cancelled mid-copy (its future
//! dropped by a timeout) hands the buffers back only once nothing more can
//! land in them (docs/local.md, "Cancelled reads"): on the same-host socket
//! the client closes its end and waits for the server, which stops copying;
//! over TCP the bytes land only while the future is polled. Played with
//! 4 and 16 MiB blocks read into the middle of one allocation: the guard
//! zones around the buffers never change, and once a read is cancelled the
//! buffers are refilled with a canary that must stay as it is after the
//! server has finished; nothing is left in flight on the server, and the
//! pool still serves whole reads.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_server::Server;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// Room for each block (the largest is 16 MiB).
const SLOT: usize = 16 * MIB;
const BLOCKS: usize = 8;
/// Untouched bytes before and after the buffers.
const GUARD: usize = MIB;
const ROUNDS: usize = 24;
/// What the buffers and guards hold while a read runs.
const BEFORE: u8 = 0x5a;
/// What the buffers hold once a read was cancelled: nothing may overwrite it.
const AFTER: u8 = 0xc3;

fn key(i: usize) -> Key {
    Key::new(Bytes::copy_from_slice(&(i as u64 | 7 << 40).to_be_bytes())).unwrap()
}

/// Block `i`: 16 MiB or 4 MiB, bytes that differ from block to block.
fn payload(i: usize) -> Bytes {
    let len = if i.is_multiple_of(2) {
        16 * MIB
    } else {
        4 * MIB
    };
    Bytes::from(
        (0..len)
            .map(|j| (j as u32).wrapping_mul(131).wrapping_add(i as u32 * 17) as u8)
            .collect::<Vec<_>>(),
    )
}

/// Whether every byte of `mem` is `b` (compared a MiB at a time).
fn all(mem: &[u8], b: u8) -> bool {
    let pattern = vec![b; MIB];
    mem.chunks(MIB).all(|c| c == &pattern[..c.len()])
}

async fn metric(server: &Server, prefix: &str) -> f64 {
    common::metrics(server)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until the server serves nothing (every cancelled request ended).
async fn settled(server: &Server) {
    let by = Instant::now() + Duration::from_secs(10);
    while metric(server, "kvtier_inflight_requests ").await != 0.0 {
        assert!(
            Instant::now() < by,
            "requests still in flight on the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Stores the blocks, then reads them into `mem`'s middle ROUNDS times,
/// each cut by a timeout a little later than the one before (the last few
/// not at all). Returns how many reads were cancelled.
async fn cancel_reads(c: &Client, server: &Server, ns: &str) -> usize {
    let payloads: Vec<Bytes> = (0..BLOCKS).map(payload).collect();
    let blocks: Vec<WriteBlock> = (0..BLOCKS)
        .map(|i| WriteBlock {
            key: key(i),
            parent: None,
            token_count: 16,
            payload: payloads[i].clone(),
            ttl_ms: 0,
        })
        .collect();
    assert_eq!(c.write(ns, &blocks).await.unwrap().stored, BLOCKS as u32);
    let keys: Vec<Key> = (0..BLOCKS).map(key).collect();
    let mut mem = vec![0u8; 2 * GUARD + BLOCKS * SLOT];
    let read = async |mem: &mut [u8], cut: Option<Duration>| {
        let mut dests: Vec<&mut [u8]> =
            mem[GUARD..GUARD + BLOCKS * SLOT].chunks_mut(SLOT).collect();
        let r = c.read_into(ns, &keys, 0, &mut dests);
        match cut {
            Some(cut) => tokio::time::timeout(cut, r).await.ok(),
            None => Some(r.await),
        }
        .map(|r| r.expect("read"))
    };
    let check = |mem: &[u8], got: &kvtier_client::ReadIntoResult| {
        assert_eq!(got.blocks.len(), BLOCKS);
        assert!(
            all(&mem[..GUARD], BEFORE),
            "the guard before the buffers changed"
        );
        assert!(
            all(&mem[GUARD + BLOCKS * SLOT..], BEFORE),
            "the guard after the buffers changed"
        );
        for b in &got.blocks {
            let at = GUARD + b.index * SLOT;
            assert!(
                mem[at..at + b.len] == payloads[b.index][..],
                "block {}",
                b.index
            );
            assert!(
                all(&mem[at + b.len..at + SLOT], BEFORE),
                "past block {}",
                b.index
            );
        }
    };
    mem.fill(BEFORE);
    let t = Instant::now();
    let got = read(&mut mem, None).await.unwrap();
    let whole = t.elapsed();
    check(&mem, &got);
    let mut cancelled = 0;
    for round in 0..ROUNDS {
        let cut = whole.mul_f64(1.2 * (round as f64 + 0.5) / ROUNDS as f64);
        mem.fill(BEFORE);
        match read(&mut mem, Some(cut)).await {
            Some(got) => check(&mem, &got),
            None => {
                // The read is dropped: the buffers are the caller's again,
                // to free or reuse. Nothing may land in them from now on.
                mem.fill(AFTER);
                settled(server).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                assert!(
                    all(&mem, AFTER),
                    "round {round} (cut after {cut:?} of {whole:?}): bytes landed in the \
                     buffers after their read was cancelled"
                );
                cancelled += 1;
            }
        }
    }
    // Nothing is left behind: no request in flight on the server, and the
    // pool (its connections and slots) still serves whole reads.
    settled(server).await;
    for _ in 0..3 {
        mem.fill(BEFORE);
        let got = tokio::time::timeout(Duration::from_secs(10), read(&mut mem, None))
            .await
            .expect("a whole read after the cancelled ones")
            .unwrap();
        check(&mem, &got);
    }
    assert!(
        cancelled >= 4,
        "only {cancelled} of {ROUNDS} reads were cut"
    );
    cancelled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_read_by_memory_leaves_the_freed_buffers_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvtier.sock");
    let mut cfg = common::test_config();
    cfg.server.local_listen = path.to_string_lossy().into();
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(512);
    let server = Server::start(cfg).await.expect("server starts");
    let mut cc = ClientConfig::new(format!("unix://{}", path.display()));
    cc.connections = 2;
    let c = Client::connect(cc).await.expect("client connects");
    assert!(c.data_plane().expect("data plane").copies_by_memory());
    cancel_reads(&c, &server, "cancel-local").await;
    // The server saw the client go and stopped copying (not merely
    // finished the read after it left).
    let stopped = metric(
        &server,
        "kvtier_requests_total{api=\"local\",op=\"read\",code=\"cancelled\"} ",
    )
    .await;
    assert!(stopped >= 1.0, "no read was stopped by its client's close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_read_over_tcp_leaves_the_freed_buffers_alone() {
    let mut cfg = common::test_config();
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(512);
    let (server, c) = common::start(cfg).await;
    let w = c.data_plane().expect("data plane");
    assert!(!w.copies_by_memory(), "received over TCP");
    cancel_reads(&c, &server, "cancel-tcp").await;
}
