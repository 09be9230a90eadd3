//! Counts what the server allocates per 1.2 MB data-plane read. Copying a
//! payload in user space needs a destination the size of the payload, so a
//! read path that allocates a small fraction of the payload per request does
//! not copy it: the stored `Bytes` goes to `writev` as is (the kernel's copy
//! into the socket is the only one). The write path is measured the same way
//! as a control: it must allocate one payload-sized buffer per write (the
//! socket's bytes have to land somewhere), which shows the counter sees the
//! server's allocations at all.
//!
//! The client side here is a blocking `std::net` socket reading into one
//! reused buffer, so (almost) everything counted is the server's.
use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use prost::Message;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

mod common;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const PAYLOAD: usize = 1_200_000;
const ROUNDS: usize = 40;

/// Reads one reply into `buf` (reused); returns its kind.
fn reply(s: &mut std::net::TcpStream, buf: &mut Vec<u8>) -> Kind {
    let mut raw = [0u8; HEADER_LEN];
    s.read_exact(&mut raw).unwrap();
    let h = Header::decode(&raw).unwrap();
    let n = (h.meta_len + h.data_len) as usize;
    buf.resize(n, 0);
    s.read_exact(&mut buf[..n]).unwrap();
    h.kind
}

#[test]
fn a_data_plane_read_allocates_far_less_than_its_payload() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(kvtier_server::Server::start(common::test_config()))
        .unwrap();
    let mut s = std::net::TcpStream::connect(server.data_addr.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let payload: Vec<u8> = (0..PAYLOAD).map(|i| (i % 239) as u8).collect();
    let crc = crc32c::crc32c(&payload);
    let write = |id: u64| {
        let meta = pb::WireWriteRequest {
            request: Some(pb::WriteRequest {
                namespace: "z".into(),
                blocks: vec![pb::Block {
                    key: Bytes::copy_from_slice(&id.to_be_bytes()),
                    crc32c: crc,
                    ..Default::default()
                }],
            }),
            payload_lengths: vec![PAYLOAD as u64],
            timeout_ms: 0,
        }
        .encode_to_vec();
        common::frame(Kind::Write, id, &meta, &payload)
    };
    let read = pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: "z".into(),
            keys: vec![Bytes::copy_from_slice(&0u64.to_be_bytes())],
            lease_id: 0,
        }),
        timeout_ms: 0,
        max_reply_bytes: 0,
    }
    .encode_to_vec();
    let read = common::frame(Kind::Read, 1, &read, &[]);
    let mut buf = Vec::with_capacity(PAYLOAD + 4096);
    // Warm up: the block to read, connection state, metric families.
    s.write_all(&write(0)).unwrap();
    assert_eq!(reply(&mut s, &mut buf), Kind::WriteReply);
    for _ in 0..3 {
        s.write_all(&read).unwrap();
        assert_eq!(reply(&mut s, &mut buf), Kind::ReadReply);
    }
    assert!(buf.len() > PAYLOAD, "the read returned the payload");

    let region = Region::new(GLOBAL);
    for _ in 0..ROUNDS {
        s.write_all(&read).unwrap();
        assert_eq!(reply(&mut s, &mut buf), Kind::ReadReply);
    }
    let reads = region.change();
    let per_read = reads.bytes_allocated / ROUNDS;

    let frames: Vec<Vec<u8>> = (1..=ROUNDS as u64).map(write).collect();
    let region = Region::new(GLOBAL);
    for f in &frames {
        s.write_all(f).unwrap();
        assert_eq!(reply(&mut s, &mut buf), Kind::WriteReply);
    }
    let writes = region.change();
    let per_write = writes.bytes_allocated / ROUNDS;

    eprintln!("allocated per 1.2 MB read: {per_read} B; per write: {per_write} B");
    assert!(
        per_write >= PAYLOAD,
        "control: a write must allocate its payload ({per_write} B)"
    );
    assert!(
        per_read < PAYLOAD / 50,
        "a read allocated {per_read} B per request: the payload ({PAYLOAD} B) is being copied"
    );
    rt.block_on(server.shutdown()).unwrap();
}
