//! A reader that stops reading holds its reply's payloads (the store's
//! buffers, alive after the blocks are deleted) for at most
//! `server.write_timeout`, and replies waiting for their clients hold at
//! most `server.reply_memory` (docs/security.md, "Threats and their
//! guards"). Its own test binary: it measures the process's RSS, which
//! other tests running alongside would disturb.
mod common;

use common::limits::block;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use kvtier_server::Server;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BLOCK: usize = 40 << 20;
const CYCLES: usize = 6;

/// This process's resident set (`VmRSS`), in bytes: the server runs in it.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb << 10
}

/// Six cycles of "write 4 × 40 MiB, Read them on a connection that never
/// reads, Delete them". Before, each stalled reply pinned its 160 MiB until
/// `server.idle_timeout` (here 60 s): the RSS grew by about 960 MiB while
/// the memory tier held nothing. Now a reply holds at most the 64 MiB
/// reply budget (one 40 MiB block; it keeps alive the 160 MiB buffer its
/// Write arrived in, which the four blocks share), later stalled Reads wait
/// for room holding no block and are refused as busy after the 1 s write
/// timeout, and each stalled connection is closed after that timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_pins_bounded_memory_briefly() {
    let mut cfg = common::test_config();
    cfg.server.request_memory = kvtier_core::ByteSize::mib(256);
    cfg.server.reply_memory = kvtier_core::ByteSize::mib(64);
    cfg.server.idle_timeout = Duration::from_secs(60);
    cfg.server.write_timeout = Duration::from_secs(1);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(512);
    cfg.engine.max_block_size = kvtier_core::ByteSize::mib(64);
    let s = Server::start(cfg).await.unwrap();
    let addr = s.data_addr.unwrap();
    let c = common::client_for(&s).await;
    let keys: Vec<String> = (0..4).map(|i| format!("b{i}")).collect();
    let read = prost::Message::encode_to_vec(&pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: "n".into(),
            keys: keys.iter().map(|k| k.clone().into_bytes().into()).collect(),
            lease_id: 0,
        }),
        timeout_ms: 0,
        max_reply_bytes: 0,
    });
    let baseline = rss();
    let mut peak = 0u64;
    let mut stuck = Vec::new();
    let mut last_read = Instant::now();
    let started = Instant::now();
    for cycle in 0..CYCLES {
        let blocks: Vec<_> = keys.iter().map(|k| block(k, BLOCK)).collect();
        c.write("n", &blocks).await.expect("blocks stored");
        drop(blocks);
        // A Read from a socket with a small receive buffer that never reads.
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let mut conn = sock.connect(addr).await.unwrap();
        conn.write_all(&common::frame(Kind::Read, 1, &read, &[]))
            .await
            .unwrap();
        common::limits::until_read_by_server(&conn).await;
        tokio::time::sleep(Duration::from_millis(100)).await; // the read is served
        stuck.push(conn);
        last_read = Instant::now();
        let keys: Vec<_> = keys
            .iter()
            .map(|k| kvtier_core::Key::new(k.as_bytes().to_vec()).unwrap())
            .collect();
        c.delete("n", &keys).await.expect("blocks deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss();
        peak = peak.max(now);
        eprintln!("cycle {cycle}: RSS {} MiB", now >> 20);
    }
    let grew = peak.saturating_sub(baseline);
    assert!(
        grew < 250 << 20,
        "RSS grew by {} MiB over {CYCLES} cycles (baseline {} MiB): deleted blocks stay pinned by stalled replies",
        grew >> 20,
        baseline >> 20
    );
    // Each stalled Read was either refused as busy (a small error frame:
    // the reply budget was held) or its reply dropped and its connection
    // closed within the write timeout, long before the 60 s idle timeout.
    // (Reading them now would un-stall a reply not yet dropped: first let
    // the last one's wait for room and then its write timeout pass.)
    tokio::time::sleep_until((last_read + Duration::from_secs(3)).into()).await;
    let mut closed = 0;
    for (i, mut conn) in stuck.into_iter().enumerate() {
        let mut head = [0u8; kvtier_proto::wire::HEADER_LEN];
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut head))
            .await
            .unwrap_or_else(|_| panic!("connection {i}: no reply"))
            .unwrap();
        let h = kvtier_proto::wire::Header::decode(&head).unwrap();
        if h.kind == Kind::Error {
            continue; // shed: it holds nothing
        }
        assert_eq!(h.kind, Kind::ReadReply, "connection {i}");
        if h.data_len == 0 {
            continue; // it waited for room holding nothing; its blocks were deleted meanwhile
        }
        let mut sink = Vec::new();
        let end = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut sink)).await;
        assert!(end.is_ok(), "stalled connection {i} still open");
        let reply = h.meta_len as usize + h.data_len as usize;
        assert!(sink.len() < reply, "connection {i} took its whole reply");
        closed += 1;
    }
    assert!(closed >= 1, "no stalled reply was served");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "{:?}",
        started.elapsed()
    );
    let m = common::metrics(&s).await;
    let dropped: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("kvtier_stalled_replies_total{front=\"data\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no kvtier_stalled_replies_total in {m}"));
    assert!(dropped >= 1.0, "{dropped}");
}
