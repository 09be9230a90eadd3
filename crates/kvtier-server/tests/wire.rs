//! The bulk data plane: the Rust client uses it for Read/Write when the server
//! advertises it; malformed frames and bad blocks get clear errors.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

fn blk(key: &[u8], payload: Bytes) -> WriteBlock {
    WriteBlock {
        key: Key::new(Bytes::copy_from_slice(key)).unwrap(),
        parent: None,
        token_count: 0,
        payload,
        ttl_ms: 0,
    }
}

#[tokio::test]
async fn client_uses_the_data_plane_and_falls_back_to_grpc_when_disabled() {
    let (server, c) = common::start(common::test_config()).await;
    let w = c.data_plane().expect("data plane advertised and used");
    assert_eq!(
        Some(w.addr().clone()),
        server.data_addr.map(kvtier_client::wire::Target::Tcp)
    );
    let big = Bytes::from(
        (0..3_000_000u32)
            .map(|i| (i % 253) as u8)
            .collect::<Vec<_>>(),
    );
    let r = c
        .write(
            "w",
            &[
                blk(b"a", big.clone()),
                blk(b"b", Bytes::new()),
                blk(b"c", Bytes::from_static(b"cc")),
            ],
        )
        .await
        .unwrap();
    assert_eq!(r.stored, 3);
    assert!(r.timing.total_us > 0);
    let keys: Vec<Key> = [&b"a"[..], b"b", b"c", b"d"]
        .iter()
        .map(|k| Key::new(Bytes::copy_from_slice(k)).unwrap())
        .collect();
    let rd = c.read("w", &keys, 0).await.unwrap();
    assert_eq!(rd.blocks.len(), 3);
    assert_eq!(rd.blocks[0].payload, big);
    assert_eq!(rd.blocks[1].payload, Bytes::new());
    assert_eq!(rd.blocks[2].payload, Bytes::from_static(b"cc"));
    assert!(rd.partial);
    assert_eq!(rd.reason, "missing");
    // The same server through gRPC only.
    let mut cc = ClientConfig::new(common::raw_endpoint(&server));
    cc.data_plane = false;
    let g = Client::connect(cc).await.unwrap();
    assert!(g.data_plane().is_none());
    assert_eq!(g.read("w", &keys, 0).await.unwrap().blocks[0].payload, big);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_blocks_get_statuses_over_the_data_plane() {
    let mut cfg = common::test_config();
    cfg.engine.max_block_size = kvtier_core::ByteSize(1 << 20);
    let (server, c) = common::start(cfg).await;
    let err = c
        .write("w", &[blk(b"big", Bytes::from(vec![0u8; (1 << 20) + 1]))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument));
    assert!(err.to_string().contains("1048576"), "{err}");
    let err = c
        .write("bad ns", &[blk(b"k", Bytes::from_static(b"v"))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument));
    let err = c
        .read("w", &[Key::new(&b"k"[..]).unwrap()], 999)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition));
    // The connection survives error replies: a good request still works.
    c.write("w", &[blk(b"ok", Bytes::from_static(b"fine"))])
        .await
        .unwrap();
    server.shutdown().await.unwrap();
}

/// Decodes an Error reply, checking its kind (and its request id, when given).
fn error_of(h: Header, meta: Bytes, id: Option<u64>) -> pb::WireError {
    assert_eq!(h.kind, Kind::Error, "expected an Error frame");
    if let Some(id) = id {
        assert_eq!(h.request_id, id, "the Error frame answers request {id}");
    }
    pb::WireError::decode(meta).expect("WireError metadata")
}

/// Sends raw bytes on a fresh connection and reads one reply.
async fn raw_exchange(addr: std::net::SocketAddr, frame: Vec<u8>) -> (Header, Bytes) {
    Raw::connect(addr).await.exchange(&frame).await
}

#[tokio::test]
async fn malformed_frames_get_error_frames() {
    let mut cfg = common::test_config();
    cfg.server.max_message_size = kvtier_core::ByteSize(64 << 20);
    let (server, _c) = common::start(cfg).await;
    let addr = server.data_addr.unwrap();
    // Not our protocol at all.
    let (h, meta) = raw_exchange(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()).await;
    let e = error_of(h, meta, None);
    assert_eq!(e.code, Code::InvalidArgument as i32);
    assert!(e.message.contains("magic"), "{}", e.message);
    // A frame claiming more than the maximum message size.
    let hdr = Header {
        kind: Kind::Write,
        request_id: 5,
        meta_len: 10,
        data_len: 100 << 20,
    }
    .encode()
    .to_vec();
    let (h, meta) = raw_exchange(addr, hdr).await;
    let e = error_of(h, meta, Some(5));
    assert!(e.message.contains("maximum message size"), "{}", e.message);
    // Payload lengths that do not add up.
    let w = pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![pb::Block {
                key: Bytes::from_static(b"k"),
                ..Default::default()
            }],
        }),
        payload_lengths: vec![10],
        timeout_ms: 0,
    }
    .encode_to_vec();
    let mut frame = Header {
        kind: Kind::Write,
        request_id: 6,
        meta_len: w.len() as u32,
        data_len: 4,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(&w);
    frame.extend_from_slice(b"abcd");
    let (h, meta) = raw_exchange(addr, frame).await;
    let e = error_of(h, meta, None);
    assert!(e.message.contains("add up"), "{}", e.message);
    // A wrong checksum: DATA_LOSS, nothing stored.
    let w = pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: "n".into(),
            blocks: vec![pb::Block {
                key: Bytes::from_static(b"k"),
                crc32c: 1,
                ..Default::default()
            }],
        }),
        payload_lengths: vec![4],
        timeout_ms: 0,
    }
    .encode_to_vec();
    let mut frame = Header {
        kind: Kind::Write,
        request_id: 7,
        meta_len: w.len() as u32,
        data_len: 4,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(&w);
    frame.extend_from_slice(b"abcd");
    let (h, meta) = raw_exchange(addr, frame).await;
    assert_eq!(error_of(h, meta, None).code, Code::DataLoss as i32);
    let l = _c
        .lookup("n", &[Key::new(&b"k"[..]).unwrap()], None)
        .await
        .unwrap();
    assert_eq!(l.found, 0);
    server.shutdown().await.unwrap();
}

/// A raw connection that sends frames and reads replies on the same socket.
struct Raw(tokio::net::TcpStream);

impl Raw {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        Raw(tokio::net::TcpStream::connect(addr).await.unwrap())
    }

    async fn send(&mut self, kind: Kind, id: u64, meta: &[u8], data: &[u8]) -> (Header, Bytes) {
        self.exchange(&common::frame(kind, id, meta, data)).await
    }

    /// Writes `bytes`, reads one reply frame; returns its header and metadata.
    async fn exchange(&mut self, bytes: &[u8]) -> (Header, Bytes) {
        self.0.write_all(bytes).await.unwrap();
        let mut raw = [0u8; HEADER_LEN];
        self.0.read_exact(&mut raw).await.unwrap();
        let h = Header::decode(&raw).unwrap();
        let mut m = vec![0u8; h.meta_len as usize];
        self.0.read_exact(&mut m).await.unwrap();
        let mut d = vec![0u8; h.data_len as usize];
        self.0.read_exact(&mut d).await.unwrap();
        (h, Bytes::from(m))
    }
}

fn write_meta(blocks: &[(&[u8], &[u8], u32)], lengths: Option<Vec<u64>>) -> Vec<u8> {
    pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: "n".into(),
            blocks: blocks
                .iter()
                .map(|(k, _, crc)| pb::Block {
                    key: Bytes::copy_from_slice(k),
                    crc32c: *crc,
                    ..Default::default()
                })
                .collect(),
        }),
        payload_lengths: lengths
            .unwrap_or_else(|| blocks.iter().map(|(_, p, _)| p.len() as u64).collect()),
        timeout_ms: 0,
    }
    .encode_to_vec()
}

#[tokio::test]
async fn rejected_frames_leave_the_connection_in_step_and_store_nothing() {
    let (server, c) = common::start(common::test_config()).await;
    let mut raw = Raw::connect(server.data_addr.unwrap()).await;
    let p: Vec<Vec<u8>> = vec![
        (0..70_000u32).map(|i| (i % 251) as u8).collect(),
        b"second".to_vec(),
        vec![],
    ];
    let keys: [&[u8]; 3] = [b"k0", b"k1", b"k2"];
    let good: Vec<(&[u8], &[u8], u32)> = keys
        .iter()
        .zip(&p)
        .map(|(k, p)| (*k, &p[..], crc32c::crc32c(p)))
        .collect();
    let data = p.concat();
    // Lengths that do not add up to the data section: error, data drained.
    let (h, m) = raw
        .send(
            Kind::Write,
            1,
            &write_meta(&good, Some(vec![1, 2, 3])),
            &data,
        )
        .await;
    let e = error_of(h, m, Some(1));
    assert!(e.message.contains("add up"), "{}", e.message);
    // Lengths that overflow when summed (and would wrap to the data size): error, not a panic.
    let wrap = vec![u64::MAX, data.len() as u64 + 1];
    let (h, m) = raw
        .send(Kind::Write, 11, &write_meta(&good[..2], Some(wrap)), &data)
        .await;
    let e = error_of(h, m, Some(11));
    assert!(e.message.contains("overflow"), "{}", e.message);
    // Undecodable metadata: error, data drained.
    let (h, m) = raw.send(Kind::Write, 2, b"\xff\xff\xff", &data).await;
    let e = error_of(h, m, Some(2));
    assert!(e.message.contains("bad write request"), "{}", e.message);
    // The middle block's checksum is wrong: DATA_LOSS and none of the three is stored.
    let mut bad = good.clone();
    bad[1].2 ^= 0x8000_0000;
    let (h, m) = raw
        .send(Kind::Write, 3, &write_meta(&bad, None), &data)
        .await;
    let e = error_of(h, m, Some(3));
    assert_eq!(e.code, Code::DataLoss as i32, "{}", e.message);
    assert!(e.message.contains("blocks[1]"), "{}", e.message);
    let all: Vec<Key> = keys.iter().map(|k| Key::new(&k[..]).unwrap()).collect();
    for k in &all {
        let l = c.lookup("n", std::slice::from_ref(k), None).await.unwrap();
        assert_eq!(l.found, 0, "nothing of a rejected write is stored");
    }
    // A read frame that carries a stray data section is answered, not desynchronised.
    let rq = pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: "n".into(),
            keys: vec![Bytes::from_static(b"k0")],
            lease_id: 0,
        }),
        timeout_ms: 0,
        max_reply_bytes: 0,
    }
    .encode_to_vec();
    let (h, _) = raw.send(Kind::Read, 4, &rq, b"stray").await;
    assert_eq!((h.kind, h.request_id), (Kind::ReadReply, 4));
    // The same connection still takes a good write, and the client reads it back verified.
    let (h, m) = raw
        .send(Kind::Write, 5, &write_meta(&good, None), &data)
        .await;
    assert_eq!((h.kind, h.request_id), (Kind::WriteReply, 5));
    assert_eq!(pb::WriteResponse::decode(m).unwrap().stored, 3);
    let r = c.read("n", &all, 0).await.unwrap();
    assert_eq!(r.blocks.len(), 3);
    for (b, want) in r.blocks.iter().zip(&p) {
        assert_eq!(&b.payload[..], &want[..]);
    }
    // Every refusal above is counted: three malformed, one checksum, one stored.
    let text = common::metrics(&server).await;
    for series in [
        "kvtier_requests_total{api=\"wire\",op=\"write\",code=\"invalid_argument\"} 3",
        "kvtier_requests_total{api=\"wire\",op=\"write\",code=\"data_loss\"} 1",
        "kvtier_requests_total{api=\"wire\",op=\"write\",code=\"ok\"} 1",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    server.shutdown().await.unwrap();
}

/// A server that corrupts nothing but lies about a checksum is caught by the
/// client's verification of the bytes it receives (DATA_LOSS, not garbage).
#[tokio::test]
async fn the_client_verifies_read_payloads_as_they_arrive() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    let crc = crc32c::crc32c(&payload);
    let sent = payload.clone();
    let srv = tokio::spawn(async move {
        let payload = sent;
        let (mut s, _) = listener.accept().await.unwrap();
        for lie in [false, true] {
            let mut raw = [0u8; HEADER_LEN];
            s.read_exact(&mut raw).await.unwrap();
            let h = Header::decode(&raw).unwrap();
            let mut m = vec![0u8; h.meta_len as usize];
            s.read_exact(&mut m).await.unwrap();
            let reply = pb::WireReadReply {
                blocks: vec![pb::ReadBlock {
                    index: 0,
                    block: Some(pb::Block {
                        key: Bytes::from_static(b"k"),
                        crc32c: if lie { crc ^ 1 } else { crc },
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                payload_lengths: vec![payload.len() as u64],
                done: Some(pb::ReadDone::default()),
            }
            .encode_to_vec();
            let hdr = Header {
                kind: Kind::ReadReply,
                request_id: h.request_id,
                meta_len: reply.len() as u32,
                data_len: payload.len() as u32,
            }
            .encode();
            s.write_all(&hdr).await.unwrap();
            s.write_all(&reply).await.unwrap();
            // In pieces, so the client sees it arrive in several reads.
            for chunk in payload.chunks(7_001) {
                s.write_all(chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
        }
    });
    let w = kvtier_client::wire::WireClient::connect(addr, 1, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    let k = [Key::new(&b"k"[..]).unwrap()];
    let ok = w.read("n", &k, 0).await.unwrap();
    assert_eq!(&ok.blocks[0].payload[..], &payload[..]);
    let err = w.read("n", &k, 0).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::DataLoss), "{err}");
    srv.await.unwrap();
}

/// A read bigger than one reply may carry: the server ends each reply at its
/// frame limit (or the client's `max_reply_bytes`) with reason `size` and at
/// least one block; the client continues transparently.
#[tokio::test]
async fn large_reads_are_split_into_replies_and_reassembled() {
    let mut cfg = common::test_config();
    cfg.engine.max_block_size = kvtier_core::ByteSize(1 << 20);
    cfg.server.max_message_size = kvtier_core::ByteSize(3 << 20);
    let (server, c) = common::start(cfg).await;
    let payloads: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![i; 1_000_000])).collect();
    let blocks: Vec<WriteBlock> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| blk(format!("k{i}").as_bytes(), p.clone()))
        .collect();
    for b in &blocks {
        c.write("big", std::slice::from_ref(b)).await.unwrap();
    }
    let mut keys: Vec<Key> = blocks.iter().map(|b| b.key.clone()).collect();
    keys.push(Key::new(&b"absent"[..]).unwrap());

    // Raw: the first reply holds what fits under 3 MiB (three 1 MB blocks), reason "size".
    let addr = server.data_addr.unwrap();
    let read_meta = |max_reply_bytes: u64, keys: &[Key]| {
        pb::WireReadRequest {
            request: Some(pb::ReadRequest {
                namespace: "big".into(),
                keys: keys.iter().map(Key::bytes).collect(),
                lease_id: 0,
            }),
            timeout_ms: 0,
            max_reply_bytes,
        }
        .encode_to_vec()
    };
    let mut raw = Raw::connect(addr).await;
    let (h, m) = raw.send(Kind::Read, 1, &read_meta(0, &keys), &[]).await;
    assert_eq!(h.kind, Kind::ReadReply);
    let r = pb::WireReadReply::decode(m).unwrap();
    let done = r.done.unwrap();
    assert_eq!((r.blocks.len(), done.reason.as_str()), (3, "size"));
    assert!(done.partial);
    assert!(h.data_len as u64 + h.meta_len as u64 <= 3 << 20);
    // The client's own, smaller limit wins, but a reply never comes back empty.
    let (h, m) = raw.send(Kind::Read, 2, &read_meta(10, &keys), &[]).await;
    let r = pb::WireReadReply::decode(m).unwrap();
    assert_eq!(
        (r.blocks.len(), r.done.unwrap().reason.as_str()),
        (1, "size")
    );
    assert_eq!(h.data_len, 1_000_000);

    // The client reassembles: every block, indices in request order, then "missing".
    let rd = c.read("big", &keys, 0).await.unwrap();
    assert_eq!(rd.blocks.len(), 8);
    for (i, b) in rd.blocks.iter().enumerate() {
        assert_eq!(b.index, i);
        assert_eq!(b.payload, payloads[i]);
    }
    assert!(rd.partial);
    assert_eq!(rd.reason, "missing");
    assert!(rd.timing.total_us > 0);
    let all = c.read("big", &keys[..8], 0).await.unwrap();
    assert_eq!(
        (all.blocks.len(), all.partial, all.reason.as_str()),
        (8, false, "")
    );
    // Bytes counted once each, even for blocks read and put back.
    let m = common::metrics(&server).await;
    let out: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("kvtier_read_payload_bytes_total "))
        .expect("bytes out metric")
        .parse()
        .unwrap();
    assert_eq!(out, (3 + 1 + 8 + 8) as f64 * 1e6, "{m}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn blocks_too_big_for_one_request_are_refused_before_sending() {
    let (server, c) = common::start(common::test_config()).await;
    // 5 × 1 GiB sharing one zeroed, never-touched allocation: no memory used.
    let gib = Bytes::from(vec![0u8; 1 << 30]);
    let blocks: Vec<WriteBlock> = (0..5)
        .map(|i| blk(format!("g{i}").as_bytes(), gib.clone()))
        .collect();
    let err = c
        .data_plane()
        .unwrap()
        .write("w", &blocks)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kvtier_client::ClientError::Invalid(_)),
        "{err}"
    );
    assert!(err.to_string().contains("server.max_message_size"), "{err}");
    server.shutdown().await.unwrap();
}

/// Data-plane Read requests the server has answered with OK so far.
async fn wire_reads(server: &kvtier_server::Server) -> u64 {
    let m = common::metrics(server).await;
    m.lines()
        .find_map(|l| l.strip_prefix(r#"kvtier_requests_total{api="wire",op="read",code="ok"} "#))
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn long_reads_are_striped_over_connections_and_joined_in_prefix_order() {
    let (server, _) = common::start(common::test_config()).await;
    let c = Client::connect(ClientConfig::new(common::raw_endpoint(&server)))
        .await
        .unwrap();
    let w = c.data_plane().expect("data plane");
    // The default pool (4 connections) and stripe floor (8 keys per stripe).
    assert_eq!(w.stripes_for(7), 1);
    assert_eq!(w.stripes_for(16), 2);
    assert_eq!(w.stripes_for(64), 4);
    let n = 64usize;
    let payload = |i: usize| Bytes::from(vec![i as u8; 10_000 + i]);
    let keys: Vec<Key> = (0..n)
        .map(|i| Key::new(format!("s{i:03}").into_bytes()).unwrap())
        .collect();
    let blocks: Vec<WriteBlock> = (0..n)
        .map(|i| blk(format!("s{i:03}").as_bytes(), payload(i)))
        .collect();
    c.write("st", &blocks).await.unwrap();

    // Whole chain: four requests, one per stripe; every block in key order.
    let before = wire_reads(&server).await;
    let rd = c.read("st", &keys, 0).await.unwrap();
    assert_eq!(
        wire_reads(&server).await - before,
        4,
        "one request per stripe"
    );
    assert_eq!(
        (rd.blocks.len(), rd.partial, rd.reason.as_str()),
        (n, false, "")
    );
    for (i, b) in rd.blocks.iter().enumerate() {
        assert_eq!(b.index, i);
        assert_eq!(b.payload, payload(i), "block {i}");
    }
    assert!(rd.timing.total_us > 0);

    // A hole at 20 (in the second stripe): the prefix ends there even though
    // the third and fourth stripes were read whole.
    c.delete("st", &keys[20..21]).await.unwrap();
    c.write("st", &blocks[21..]).await.unwrap(); // keys are unlinked: only 20 went
    let rd = c.read("st", &keys, 0).await.unwrap();
    assert_eq!(
        (rd.blocks.len(), rd.partial, rd.reason.as_str()),
        (20, true, "missing")
    );
    assert!(
        rd.blocks
            .iter()
            .enumerate()
            .all(|(i, b)| b.index == i && b.payload == payload(i))
    );

    // The same answer unstriped, in one request.
    let mut cc = ClientConfig::new(common::raw_endpoint(&server));
    cc.read_stripes = 1;
    let one = Client::connect(cc).await.unwrap();
    let before = wire_reads(&server).await;
    let rd1 = one.read("st", &keys, 0).await.unwrap();
    assert_eq!(wire_reads(&server).await - before, 1);
    assert_eq!(
        (rd1.blocks.len(), rd1.partial, rd1.reason.as_str()),
        (20, true, "missing")
    );
    server.shutdown().await.unwrap();
}

/// Sends a Read of `ns`/`k` to the data plane at `addr` from another thread
/// while this test's runtime (which runs the server) is blocked: nothing
/// runs until the request is in its socket, and for 300 ms after. Returns
/// the reply's header and metadata.
async fn read_while_busy(addr: std::net::SocketAddr, ns: &str) -> (Header, Bytes) {
    assert!(
        kvtier_server::rx_stamp::kernel_stamps_on(std::time::Duration::from_secs(10)).await,
        "the kernel never stamped a received packet (SO_TIMESTAMPING)"
    );
    let (sent_tx, sent_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(Header, Bytes)>();
    let meta = pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: ns.into(),
            keys: vec![Bytes::from_static(b"k")],
            lease_id: 0,
        }),
        timeout_ms: 0,
        max_reply_bytes: 0,
    }
    .encode_to_vec();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&common::frame(Kind::Read, 7, &meta, &[]))
            .unwrap();
        sent_tx.send(()).unwrap();
        let mut raw = [0u8; HEADER_LEN];
        s.read_exact(&mut raw).unwrap();
        let h = Header::decode(&raw).unwrap();
        let mut m = vec![0u8; h.meta_len as usize + h.data_len as usize];
        s.read_exact(&mut m).unwrap();
        m.truncate(h.meta_len as usize);
        done_tx.send((h, Bytes::from(m))).unwrap();
    });
    // The server is "busy": this runtime runs nothing meanwhile.
    sent_rx.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    tokio::task::spawn_blocking(move || done_rx.recv().unwrap())
        .await
        .unwrap()
}

/// A request that waits in its socket while the server is busy is queued,
/// and says so: its reply's `queue_us` counts from when the kernel received
/// it (SO_TIMESTAMPING), not from when the server got round to reading it.
#[tokio::test]
async fn time_spent_in_the_socket_counts_as_queue_time() {
    let (server, c) = common::start(common::test_config()).await;
    c.write("q", &[blk(b"k", Bytes::from_static(b"v"))])
        .await
        .unwrap();
    let (h, m) = read_while_busy(server.data_addr.unwrap(), "q").await;
    assert_eq!(h.kind, Kind::ReadReply);
    let done = pb::WireReadReply::decode(m).unwrap().done.unwrap();
    assert_eq!(done.returned, 1);
    let t = done.timing.unwrap();
    assert!(
        t.queue_us >= 300_000 && t.total_us >= t.queue_us,
        "queue_us {} (total {}): the 300 ms in the socket should count",
        t.queue_us,
        t.total_us
    );
    server.shutdown().await.unwrap();
}

/// With the adaptive limit, a request that already queued in its socket far
/// past `limit × min_rtt` is shed at once (UNAVAILABLE, counted in
/// `kvtier_shed_total`) instead of being served late (notes/028).
#[tokio::test]
async fn the_adaptive_limit_sheds_a_request_that_queued_in_its_socket() {
    let mut cfg = common::test_config();
    cfg.server.concurrency_limit = kvtier_server::admission::Mode::Adaptive;
    let (server, c) = common::start(cfg).await;
    c.write("q", &[blk(b"k", Bytes::from_static(b"v"))])
        .await
        .unwrap();
    // min_rtt is measured over the front's first requests, one at a time.
    let k = [Key::new(&b"k"[..]).unwrap()];
    for _ in 0..kvtier_server::admission::MIN_RTT_SAMPLES + 10 {
        assert_eq!(c.read("q", &k, 0).await.unwrap().blocks.len(), 1);
    }
    let (h, m) = read_while_busy(server.data_addr.unwrap(), "q").await;
    assert_eq!(h.kind, Kind::Error);
    let e = pb::WireError::decode(m).unwrap();
    assert_eq!(Code::from(e.code), Code::Unavailable, "{}", e.message);
    assert!(e.message.contains("waited in its socket"), "{}", e.message);
    // With the hint a gRPC refusal carries, for the client's back-off.
    assert!(
        (10..=1000).contains(&e.retry_pushback_ms),
        "retry hint {} ms",
        e.retry_pushback_ms
    );
    // At least this one (a loaded machine may shed others on the way).
    assert!(common::shed_total(&server).await >= 1.0);
    server.shutdown().await.unwrap();
}
