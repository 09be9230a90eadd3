//! Attacks on the same-host socket's shared memory (docs/security.md,
//! "Shared memory"). Each test plays a client that speaks the frames
//! itself, keeps every descriptor the server hands it and does what a
//! hostile client would with them; each fails without the guard it names.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use kvtier_server::Server;
use kvtier_shm::Mapping;
use prost::Message;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

const MIB: usize = 1 << 20;

fn key(i: u32) -> Key {
    Key::new(Bytes::copy_from_slice(
        &(u64::from(i) | 1 << 41).to_be_bytes(),
    ))
    .unwrap()
}

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

/// `len` bytes of a 16-byte pattern no other payload here contains.
fn canary(len: usize) -> Bytes {
    let pat = *b"TENANT-B-CANARY!";
    Bytes::from((0..len).map(|i| pat[i % 16]).collect::<Vec<_>>())
}

fn filler(i: u32, len: usize) -> Bytes {
    Bytes::from(vec![(i % 251) as u8 + 1; len])
}

const TOKENS: &str = common::TWO_TENANTS;

async fn server(dir: &tempfile::TempDir, tokens: bool) -> (Server, String) {
    let path = dir.path().join("kvtier.sock");
    let mut cfg = common::test_config();
    cfg.server.local_listen = path.to_string_lossy().into();
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    if tokens {
        let t = dir.path().join("tokens.toml");
        std::fs::write(&t, TOKENS).unwrap();
        cfg.auth.tokens_file = t.to_string_lossy().into();
    }
    let s = Server::start(cfg).await.expect("server starts");
    (s, path.to_string_lossy().into())
}

async fn client(path: &str, token: Option<&str>) -> Client {
    let mut cc = ClientConfig::new(format!("unix://{path}"));
    cc.connections = 2;
    cc.token = token.map(str::to_string);
    Client::connect(cc).await.expect("client connects")
}

/// A client speaking the frames itself, keeping every descriptor.
struct Raw {
    sock: UnixStream,
    next: u64,
    maps: std::collections::HashMap<u64, Mapping>,
}

struct Got {
    kind: Kind,
    meta: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Raw {
    fn connect(path: &str, token: Option<&str>) -> Self {
        let mut r = Self {
            sock: UnixStream::connect(path).unwrap(),
            next: 1,
            maps: Default::default(),
        };
        if let Some(t) = token {
            let hello = pb::WireHello { token: t.into() };
            assert_eq!(
                r.call(Kind::Hello, &hello.encode_to_vec()).kind,
                Kind::HelloReply
            );
        }
        r
    }

    fn call(&mut self, kind: Kind, meta: &[u8]) -> Got {
        self.next += 1;
        self.sock
            .write_all(&common::frame(kind, self.next, meta, &[]))
            .unwrap();
        let mut raw = [0u8; HEADER_LEN];
        let mut fds = Vec::new();
        let mut got = 0;
        while got < HEADER_LEN {
            match kvtier_shm::fdpass::recv(self.sock.as_fd(), &mut raw[got..], &mut fds) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        let h = Header::decode(&raw).unwrap();
        let mut meta = vec![0u8; h.meta_len as usize];
        let mut data = vec![0u8; h.data_len as usize];
        use std::io::Read;
        self.sock.read_exact(&mut meta).unwrap();
        self.sock.read_exact(&mut data).unwrap();
        Got {
            kind: h.kind,
            meta,
            fds,
        }
    }

    fn read_req(ns: &str, keys: &[Key]) -> Vec<u8> {
        pb::WireReadRequest {
            request: Some(pb::ReadRequest {
                namespace: ns.into(),
                keys: keys.iter().map(Key::bytes).collect(),
                lease_id: 0,
            }),
            timeout_ms: 0,
            max_reply_bytes: 0,
        }
        .encode_to_vec()
    }

    /// A MapRead whose segments are all mapped and kept; the reply.
    fn map_read(&mut self, ns: &str, keys: &[Key]) -> Result<pb::WireMapReadReply, pb::WireError> {
        let g = self.call(Kind::MapRead, &Self::read_req(ns, keys));
        if g.kind == Kind::Error {
            assert!(g.fds.is_empty(), "a refusal carries no descriptor");
            return Err(pb::WireError::decode(&g.meta[..]).unwrap());
        }
        assert_eq!(g.kind, Kind::MapReadReply);
        let m = pb::WireMapReadReply::decode(&g.meta[..]).unwrap();
        assert_eq!(m.segments.len(), g.fds.len());
        for (s, fd) in m.segments.iter().zip(g.fds) {
            self.maps
                .insert(s.id, Mapping::new(fd, s.len as usize, false).unwrap());
        }
        Ok(m)
    }

    fn release(&mut self, lease: u64) {
        let r = pb::WireRelease {
            leases: vec![lease],
        };
        assert_eq!(
            self.call(Kind::Release, &r.encode_to_vec()).kind,
            Kind::ReleaseReply
        );
    }

    /// Whether any mapping this client holds contains `needle`.
    fn finds(&self, needle: &[u8]) -> bool {
        self.maps.values().any(|m| {
            m.get(0, m.len() as u64)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
        })
    }
}

/// One arena per namespace: tenant A, holding every segment the server
/// hands it and asking for more, finds no byte of tenant B's blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_mappings_hold_no_byte_of_another_tenants_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (_s, path) = server(&dir, true).await;
    let a = client(&path, Some("token-for-tenant-a-0001")).await;
    let b = client(&path, Some("token-for-tenant-b-0002")).await;
    // Interleaved, so that one shared arena would hold both side by side.
    for i in 0..8 {
        a.write("a/x", &[blk(i, filler(i, MIB))]).await.unwrap();
        b.write("b/x", &[blk(i, canary(MIB))]).await.unwrap();
    }
    let path2 = path.clone();
    tokio::task::spawn_blocking(move || {
        let needle = &canary(64)[..];
        let mut ra = Raw::connect(&path2, Some("token-for-tenant-a-0001"));
        let keys: Vec<Key> = (0..8).map(key).collect();
        let m = ra.map_read("a/x", &keys).unwrap();
        assert_eq!(m.slots.len(), 8);
        assert!(!ra.maps.is_empty(), "tenant a was handed segments");
        // B's namespace: refused, and no descriptor comes with the refusal.
        let e = ra.map_read("b/x", &keys).unwrap_err();
        assert_eq!(
            e.code,
            tonic::Code::PermissionDenied as i32,
            "{}",
            e.message
        );
        assert!(
            !ra.finds(needle),
            "tenant a's mappings hold tenant b's bytes"
        );
        // The same scan finds B's bytes in B's own mappings.
        let mut rb = Raw::connect(&path2, Some("token-for-tenant-b-0002"));
        rb.map_read("b/x", &keys).unwrap();
        assert!(rb.finds(needle), "the scan finds what is there");
    })
    .await
    .unwrap();
}

/// A slot under lease is never reused: the bytes a client maps stay what
/// they were while it holds the lease, however the tier churns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_under_lease_is_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (_s, path) = server(&dir, false).await;
    let c = client(&path, None).await;
    let first = filler(1, MIB);
    c.write("l", &[blk(1, first.clone())]).await.unwrap();
    let p = path.clone();
    let (mut raw, lease, slot) = tokio::task::spawn_blocking(move || {
        let mut raw = Raw::connect(&p, None);
        let m = raw.map_read("l", &[key(1)]).unwrap();
        assert_ne!(m.lease, 0);
        (raw, m.lease, m.slots[0])
    })
    .await
    .unwrap();
    let view = |raw: &Raw| {
        raw.maps[&slot.segment]
            .get(slot.offset, MIB as u64)
            .unwrap()
            .to_vec()
    };
    // Churn: the block deleted, others of the same size written and deleted.
    for round in 0..3u32 {
        c.delete("l", &[key(1)]).await.unwrap();
        for i in 2..10 {
            c.write("l", &[blk(i, filler(i + round * 10, MIB))])
                .await
                .unwrap();
        }
        assert_eq!(
            view(&raw),
            &first[..],
            "a leased slot was reused (round {round})"
        );
        c.delete("l", &(2..10).map(key).collect::<Vec<_>>())
            .await
            .unwrap();
    }
    // Released: now the slot may be, and is, reused (the check above can fail).
    let raw = tokio::task::spawn_blocking(move || {
        raw.release(lease);
        raw
    })
    .await
    .unwrap();
    for i in 20..30 {
        c.write("l", &[blk(i, filler(i, MIB))]).await.unwrap();
    }
    assert_ne!(view(&raw), &first[..], "a released slot is reused");
}

/// Saves: what a client writes into its lent segment after the write was
/// answered changes nothing a reader sees, and a client cannot shrink the
/// segment under the server (whose copy would then fault).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_into_a_lent_segment_after_commit_changes_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (_s, path) = server(&dir, false).await;
    let p = path.clone();
    let original = filler(5, MIB);
    let o = original.clone();
    tokio::task::spawn_blocking(move || {
        let mut raw = Raw::connect(&p, None);
        let lend = pb::WireLend { len: MIB as u64 };
        let g = raw.call(Kind::Lend, &lend.encode_to_vec());
        assert_eq!(g.kind, Kind::LendReply);
        let lent = pb::WireLent::decode(&g.meta[..]).unwrap().segment.unwrap();
        let fd = g
            .fds
            .into_iter()
            .next()
            .expect("the lent segment's descriptor");
        // Sealed: shrinking it fails, so the server's copy cannot fault.
        assert!(
            nix::unistd::ftruncate(&fd, 0).is_err(),
            "the lent segment shrank"
        );
        let map = Mapping::new(fd, lent.len as usize, true).unwrap();
        assert!(map.put(0, &o));
        let w = pb::WireWriteRequest {
            request: Some(pb::WriteRequest {
                namespace: "w".into(),
                blocks: vec![pb::Block {
                    key: key(5).bytes(),
                    token_count: 128,
                    crc32c: crc32c::crc32c(&o),
                    ..Default::default()
                }],
            }),
            payload_lengths: vec![MIB as u64],
            timeout_ms: 0,
        };
        let g = raw.call(Kind::WriteLent, &w.encode_to_vec());
        assert_eq!(
            g.kind,
            Kind::WriteReply,
            "{:?}",
            pb::WireError::decode(&g.meta[..])
        );
        // After the answer, the client scribbles over its segment.
        assert!(map.put(0, &vec![0xEE; MIB]));
    })
    .await
    .unwrap();
    let c = client(&path, None).await;
    let mut buf = vec![0u8; MIB];
    let got = c
        .read_into("w", &[key(5)], 0, &mut [&mut buf[..]])
        .await
        .unwrap();
    assert_eq!(got.blocks.len(), 1);
    assert_eq!(
        &buf[..],
        &original[..],
        "the stored block changed after commit"
    );
}

/// Descriptors a client attaches to its frames are never taken: the server
/// maps only memory it created, and the request is served as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_a_client_sends_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (_s, path) = server(&dir, false).await;
    let c = client(&path, None).await;
    c.write("f", &[blk(1, filler(1, 4096))]).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let mut raw = Raw::connect(&path, None);
        let memfd =
            nix::sys::memfd::memfd_create(c"evil", nix::sys::memfd::MFdFlags::empty()).unwrap();
        nix::unistd::ftruncate(&memfd, 4096).unwrap();
        let frame = common::frame(Kind::MapRead, 77, &Raw::read_req("f", &[key(1)]), &[]);
        let n = kvtier_shm::fdpass::send(
            raw.sock.as_fd(),
            &[std::io::IoSlice::new(&frame)],
            &[memfd.as_fd()],
        )
        .unwrap();
        raw.sock.write_all(&frame[n..]).unwrap();
        // The reply to frame 77 (read by the next call's reader: call it with a Release).
        let g = raw.call(
            Kind::Release,
            &pb::WireRelease { leases: vec![] }.encode_to_vec(),
        );
        assert_eq!(
            g.kind,
            Kind::MapReadReply,
            "the frame with a descriptor is served"
        );
        // Truncating the client's own memfd now harms nobody.
        nix::unistd::ftruncate(&memfd, 0).unwrap();
        let g = raw.call(
            Kind::Release,
            &pb::WireRelease { leases: vec![] }.encode_to_vec(),
        );
        assert_eq!(g.kind, Kind::ReleaseReply);
    })
    .await
    .unwrap();
    assert_eq!(c.lookup("f", &[key(1)], None).await.unwrap().found, 1);
}

/// Segments are bounded by `server.local_shared_memory`: when it runs out,
/// empty segments of any namespace are retired for the blocks that need
/// room, and a connection that had mapped one is told to unmap it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retired_segments_are_named_to_the_connections_that_mapped_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvtier.sock");
    let mut cfg = common::test_config();
    cfg.server.local_listen = path.to_string_lossy().into();
    cfg.server.local_shared_memory = kvtier_core::ByteSize::mib(8);
    let _s = Server::start(cfg).await.unwrap();
    let path = path.to_string_lossy().to_string();
    let c = client(&path, None).await;
    // Namespace "x" takes the whole budget (one 4 MiB segment, then 8 MiB
    // would not fit: the second block goes to ordinary memory).
    c.write("x", &[blk(1, filler(1, 3 * MIB))]).await.unwrap();
    let p = path.clone();
    let mut raw = tokio::task::spawn_blocking(move || {
        let mut raw = Raw::connect(&p, None);
        let m = raw.map_read("x", &[key(1)]).unwrap();
        raw.release(m.lease);
        raw
    })
    .await
    .unwrap();
    let seg = *raw.maps.keys().next().expect("x's segment was mapped");
    c.delete("x", &[key(1)]).await.unwrap();
    // "y" needs room: x's empty segment is retired for it.
    c.write("y", &[blk(2, filler(2, 3 * MIB))]).await.unwrap();
    let mut buf = vec![0u8; 3 * MIB];
    assert_eq!(
        c.read_into("y", &[key(2)], 0, &mut [&mut buf[..]])
            .await
            .unwrap()
            .blocks
            .len(),
        1
    );
    assert_eq!(&buf[..], &filler(2, 3 * MIB)[..]);
    let retired = tokio::task::spawn_blocking(move || {
        let g = raw.call(Kind::MapRead, &Raw::read_req("x", &[key(1)]));
        assert_eq!(g.kind, Kind::MapReadReply);
        pb::WireMapReadReply::decode(&g.meta[..]).unwrap().retired
    })
    .await
    .unwrap();
    assert_eq!(
        retired,
        vec![seg],
        "the retired segment is named to the connection that mapped it"
    );
}
