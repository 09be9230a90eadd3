//! Bad requests on the bulk data plane get clear errors (docs/wire.md):
//! bad blocks get gRPC-like statuses, malformed frames get Error frames, and
//! a rejected frame leaves the connection in step and stores nothing.
mod common;

use bytes::Bytes;
use common::wire::{Raw, blk};
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{Header, Kind};
use prost::Message;
use tonic::Code;

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
