//! Reads larger than one reply or one connection (docs/wire.md): the server
//! ends a reply at its frame limit (or the client's) and the client
//! continues; a long read is striped over the client's connections and
//! joined in prefix order.
mod common;

use bytes::Bytes;
use common::wire::{Raw, blk};
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use prost::Message;

/// Data-plane Read requests the server has answered with OK so far.
async fn wire_reads(server: &kvtier_server::Server) -> u64 {
    let m = common::metrics(server).await;
    m.lines()
        .find_map(|l| l.strip_prefix(r#"kvtier_requests_total{api="wire",op="read",code="ok"} "#))
        .map_or(0, |v| v.parse().unwrap())
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
