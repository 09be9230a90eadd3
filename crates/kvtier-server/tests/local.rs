//! The same-host socket (docs/local.md): gRPC and the data plane on one Unix
//! socket, payloads through shared memory the server creates, copied by the
//! client straight into and out of the caller's buffers; clients given the
//! TCP address upgrade to it; tokens apply; the socket file is owner-only;
//! small buffers and bad saves get clear errors; readers racing deletes and
//! re-writes never see torn bytes. The attacks on the shared memory itself
//! are in `shared_memory.rs`.
mod common;

use bytes::Bytes;
use kvtier_client::wire::Target;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_server::Server;
use std::os::unix::fs::PermissionsExt;
use tonic::Code;

const MIB: usize = 1 << 20;

fn blk(i: u32, payload: Bytes) -> WriteBlock {
    WriteBlock {
        token_ids: Vec::new(),
        key: key(i),
        parent: None,
        token_count: 128,
        payload,
        ttl_ms: 0,
    }
}

fn key(i: u32) -> Key {
    Key::new(Bytes::copy_from_slice(
        &(u64::from(i) | 1 << 40).to_be_bytes(),
    ))
    .unwrap()
}

fn payload(i: u32, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i * 7) as u8)
            .collect::<Vec<_>>(),
    )
}

async fn server(dir: &tempfile::TempDir) -> (Server, String) {
    let path = dir.path().join("kvtier.sock");
    let mut cfg = common::test_config();
    cfg.server.local_listen = path.to_string_lossy().into();
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(512);
    let s = Server::start(cfg).await.expect("server starts");
    (s, path.to_string_lossy().into())
}

async fn unix_client(path: &str, token: Option<&str>) -> Client {
    let mut cc = ClientConfig::new(format!("unix://{path}"));
    cc.connections = 2;
    cc.token = token.map(str::to_string);
    Client::connect(cc).await.expect("client connects")
}

#[tokio::test]
async fn blocks_move_by_memory_into_the_callers_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let (server, path) = server(&dir).await;
    assert_eq!(
        server.same_host_path.as_deref(),
        Some(std::path::Path::new(&path))
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "owner-only by default");
    let c = unix_client(&path, None).await;
    let w = c.data_plane().expect("data plane");
    assert_eq!(w.addr(), &Target::Unix(path.clone().into()));
    assert!(w.copies_by_memory());
    // 16 blocks of 4 MiB: striped over the pool, through shared memory.
    let blocks: Vec<WriteBlock> = (0..16).map(|i| blk(i, payload(i, 4 * MIB))).collect();
    let r = c.write("m", &blocks).await.unwrap();
    assert_eq!(r.stored, 16);
    let keys: Vec<Key> = (0..17).map(key).collect();
    let mut bufs: Vec<Vec<u8>> = (0..17).map(|_| vec![0u8; 4 * MIB + 7]).collect();
    let mut dests: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let got = c.read_into("m", &keys, 0, &mut dests).await.unwrap();
    assert_eq!(got.blocks.len(), 16);
    assert_eq!(got.reason, "missing");
    for b in &got.blocks {
        assert_eq!(b.len, 4 * MIB);
        assert_eq!(
            &bufs[b.index][..b.len],
            &payload(b.index as u32, 4 * MIB)[..],
            "block {}",
            b.index
        );
    }
    // Lookups and the rest of gRPC go through the same socket.
    let l = c.lookup("m", &keys, None).await.unwrap();
    assert_eq!(l.found, 16);
}

#[tokio::test]
async fn a_client_given_the_tcp_address_upgrades_to_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (server, path) = server(&dir).await;
    let c = common::client_for(&server).await;
    let w = c.data_plane().expect("data plane");
    assert_eq!(w.addr(), &Target::Unix(path.into()), "upgraded");
    c.write("u", &[blk(1, payload(1, MIB))]).await.unwrap();
    let mut buf = vec![0u8; MIB];
    let got = c
        .read_into("u", &[key(1)], 0, &mut [&mut buf[..]])
        .await
        .unwrap();
    assert_eq!(got.blocks.len(), 1);
    assert_eq!(&buf[..], &payload(1, MIB)[..]);
}

#[tokio::test]
async fn a_socket_in_use_is_refused_and_a_stale_one_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (a, path) = server(&dir).await;
    let mut cfg = common::test_config();
    cfg.server.local_listen = path.clone();
    let e = Server::start(cfg.clone()).await.err().expect("path in use");
    assert!(e.to_string().contains("another process listens"), "{e}");
    a.shutdown().await.unwrap();
    assert!(!std::path::Path::new(&path).exists(), "removed at shutdown");
    // A socket file nobody listens on (a server that was killed).
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(std::path::Path::new(&path).exists());
    let b = Server::start(cfg).await.expect("stale socket replaced");
    let c = common::client_for(&b).await;
    assert_eq!(c.data_plane().unwrap().addr(), &Target::Unix(path.into()));
}

#[tokio::test]
async fn a_socket_at_the_advertised_path_of_another_server_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("q.sock");
    // C advertises q; then its file is moved away and B listens at q.
    let mut cfg = common::test_config();
    cfg.server.local_listen = q.to_string_lossy().into();
    let c_server = Server::start(cfg.clone()).await.unwrap();
    std::fs::rename(&q, dir.path().join("c-moved.sock")).unwrap();
    let _b = Server::start(cfg).await.unwrap();
    let c = common::client_for(&c_server).await;
    assert!(
        matches!(c.data_plane().unwrap().addr(), Target::Tcp(_)),
        "C's client stays on C's TCP data plane"
    );
}

#[tokio::test]
async fn small_buffers_and_bad_saves_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, path) = server(&dir).await;
    let c = unix_client(&path, None).await;
    c.write("e", &[blk(1, payload(1, MIB))]).await.unwrap();
    let mut small = vec![0u8; MIB - 1];
    let e = c
        .read_into("e", &[key(1)], 0, &mut [&mut small[..]])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(e.to_string().contains("fewer bytes than its block"), "{e}");
    // A WriteLent on a connection that was lent nothing is refused and
    // nothing is stored; the connection stays usable.
    use kvtier_proto::v1 as pb;
    use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = payload(2, 4096);
    let req = pb::WireWriteRequest {
        request: Some(pb::WriteRequest {
            namespace: "e".into(),
            blocks: vec![pb::Block {
                key: key(2).bytes(),
                token_count: 128,
                crc32c: crc32c::crc32c(&p),
                ..Default::default()
            }],
        }),
        payload_lengths: vec![4096],
        timeout_ms: 0,
    };
    let mut sock = tokio::net::UnixStream::connect(&path).await.unwrap();
    for _ in 0..2 {
        let f = common::frame(Kind::WriteLent, 9, &req.encode_to_vec(), &[]);
        sock.write_all(&f).await.unwrap();
        let mut raw = [0u8; HEADER_LEN];
        sock.read_exact(&mut raw).await.unwrap();
        let h = Header::decode(&raw).unwrap();
        assert_eq!(h.kind, Kind::Error);
        let mut meta = vec![0u8; h.meta_len as usize];
        sock.read_exact(&mut meta).await.unwrap();
        let e = pb::WireError::decode(&meta[..]).unwrap();
        assert_eq!(e.code, Code::FailedPrecondition as i32, "{}", e.message);
        assert!(e.message.contains("WriteLent before Lend"), "{}", e.message);
    }
    assert_eq!(c.lookup("e", &[key(2)], None).await.unwrap().found, 0);
}

const TOKENS: &str = common::TWO_TENANTS;

#[tokio::test]
async fn tokens_apply_on_the_socket_and_no_tenant_reads_anothers_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let path = dir.path().join("kvtier.sock");
    let mut cfg = common::test_config();
    cfg.server.local_listen = path.to_string_lossy().into();
    cfg.auth.tokens_file = tokens.to_string_lossy().into();
    let _s = Server::start(cfg).await.unwrap();
    let path = path.to_string_lossy().to_string();
    let a = unix_client(&path, Some("token-for-tenant-a-0001")).await;
    let b = unix_client(&path, Some("token-for-tenant-b-0002")).await;
    a.write("a/x", &[blk(1, payload(1, MIB))]).await.unwrap();
    let mut buf = vec![0u8; MIB];
    let e = b
        .read_into("a/x", &[key(1)], 0, &mut [&mut buf[..]])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::PermissionDenied), "{e}");
    assert!(
        buf.iter().all(|&x| x == 0),
        "nothing of tenant a was copied"
    );
    let e = b
        .write("a/x", &[blk(2, payload(2, MIB))])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::PermissionDenied), "{e}");
    // Without a token nothing is served.
    let mut cc = ClientConfig::new(format!("unix://{path}"));
    cc.connections = 1;
    let e = Client::connect(cc).await.err().expect("refused");
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
}

#[tokio::test]
async fn writes_larger_than_a_request_are_split_to_fit() {
    let dir = tempfile::tempdir().unwrap();
    for local in [true, false] {
        let path = dir.path().join(format!("split-{local}.sock"));
        let mut cfg = common::test_config();
        if local {
            cfg.server.local_listen = path.to_string_lossy().into();
        }
        cfg.server.max_message_size = kvtier_core::ByteSize::mib(64);
        cfg.engine.max_block_size = kvtier_core::ByteSize::mib(16);
        cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(1024);
        let server = Server::start(cfg).await.unwrap();
        let c = common::client_for(&server).await;
        assert_eq!(
            matches!(c.data_plane().unwrap().addr(), Target::Unix(_)),
            local
        );
        // 12 blocks of 16 MiB (an 8B model's block): 192 MiB, three times the limit.
        let blocks: Vec<WriteBlock> = (0..12).map(|i| blk(i, payload(i, 16 * MIB))).collect();
        let r = c.write("big", &blocks).await.unwrap();
        assert_eq!(r.stored, 12, "local={local}");
        let keys: Vec<Key> = (0..12).map(key).collect();
        assert_eq!(c.lookup("big", &keys, None).await.unwrap().found, 12);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_racing_deletes_and_rewrites_never_see_torn_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, path) = server(&dir).await;
    let c = unix_client(&path, None).await;
    let versions = [payload(1, 2 * MIB), payload(2, 2 * MIB)];
    c.write("r", &[blk(1, versions[0].clone())]).await.unwrap();
    let writer = {
        let c = c.clone();
        let versions = versions.clone();
        tokio::spawn(async move {
            for n in 0..200usize {
                c.delete("r", &[key(1)]).await.unwrap();
                c.write("r", &[blk(1, versions[n % 2].clone())])
                    .await
                    .unwrap();
            }
        })
    };
    let mut seen = 0;
    let mut buf = vec![0u8; 2 * MIB];
    while !writer.is_finished() {
        buf.fill(0xAA);
        let got = c
            .read_into("r", &[key(1)], 0, &mut [&mut buf[..]])
            .await
            .unwrap();
        if got.blocks.len() == 1 {
            seen += 1;
            assert!(
                buf[..] == versions[0][..] || buf[..] == versions[1][..],
                "a read returned bytes of neither version"
            );
        }
    }
    writer.await.unwrap();
    assert!(seen > 0, "some reads found the block");
}

/// Only the server's "cannot share memory with this process" reason turns
/// shared memory off: a refusal of the request itself (an unknown lease)
/// leaves it on.
#[tokio::test]
async fn a_refused_lease_leaves_copies_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, path) = server(&dir).await;
    let c = unix_client(&path, None).await;
    let w = c.data_plane().expect("data plane");
    c.write("l", &[blk(1, payload(1, 4 * MIB))]).await.unwrap();
    let mut buf = vec![0u8; 4 * MIB];
    let Err(e) = c
        .read_into("l", &[key(1)], 424_242, &mut [&mut buf[..]])
        .await
    else {
        panic!("an unknown lease is refused");
    };
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");
    assert!(w.copies_by_memory(), "a lease refusal turned copies off");
    let got = c
        .read_into("l", &[key(1)], 0, &mut [&mut buf[..]])
        .await
        .unwrap();
    assert_eq!(got.blocks.len(), 1);
    assert_eq!(&buf[..], &payload(1, 4 * MIB)[..]);
}
