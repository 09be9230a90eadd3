//! The Rust client on the bulk data plane (docs/wire.md): it uses the data
//! plane when the server advertises it and gRPC when told not to, verifies
//! read payloads as they arrive, and refuses a request too big for one
//! message before sending it.
mod common;

use bytes::Bytes;
use common::wire::blk;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

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
