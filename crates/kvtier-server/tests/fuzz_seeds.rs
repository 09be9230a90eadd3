//! The fuzz corpora's seeds: valid inputs of every kind each target parses,
//! made here by the real encoders (protobuf messages, data-plane frame
//! headers, disk record headers, kvstore locations), so that the fuzzers
//! start from the interesting paths and not from random bytes.
//!
//! The seeds are checked in as `fuzz/corpus/<target>/seed-<name>`. This test
//! fails when a checked-in seed differs from what the encoders make today
//! (the format changed) or when a `seed-` file is no longer made here;
//! `KVTIER_WRITE_FUZZ_SEEDS=1 cargo test -p kvtier-server --test fuzz_seeds`
//! rewrites them (fuzz/README.md). It also checks each seed still reaches
//! the path it is for: the valid ones are accepted, the refused ones refused.
use bytes::Bytes;
use kvtier_core::disk::format;
use kvtier_core::{Block, BlockId, Key, Namespace};
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use kvtier_proto::{kvstore, v1};
use kvtier_server::fuzzing;
use kvtier_server::grpc::kvstore_records as records;
use prost::Message;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../fuzz/corpus/{target}"))
}

/// One data-plane frame (docs/wire.md).
fn frame(kind: Kind, id: u64, meta: &[u8], data: &[u8]) -> Vec<u8> {
    let mut f = Header {
        kind,
        request_id: id,
        meta_len: meta.len() as u32,
        data_len: data.len() as u32,
    }
    .encode()
    .to_vec();
    f.extend_from_slice(meta);
    f.extend_from_slice(data);
    f
}

fn pb_block(key: &[u8], payload: &[u8]) -> v1::Block {
    v1::Block {
        key: Bytes::copy_from_slice(key),
        crc32c: crc32c::crc32c(payload),
        payload: Bytes::copy_from_slice(payload),
        ..Default::default()
    }
}

/// A data-plane Write: the blocks' metadata (checksums, no payloads) and
/// the payloads as the frame's data.
fn wire_write(namespace: &str, blocks: &[(&[u8], &[u8])]) -> (Vec<u8>, Vec<u8>) {
    let req = v1::WireWriteRequest {
        request: Some(v1::WriteRequest {
            namespace: namespace.into(),
            blocks: blocks
                .iter()
                .map(|(k, p)| v1::Block {
                    key: Bytes::copy_from_slice(k),
                    crc32c: crc32c::crc32c(p),
                    ..Default::default()
                })
                .collect(),
        }),
        payload_lengths: blocks.iter().map(|(_, p)| p.len() as u64).collect(),
        timeout_ms: 1000,
    };
    let data = blocks.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    (req.encode_to_vec(), data)
}

fn wire_read(namespace: &str, keys: &[&[u8]]) -> Vec<u8> {
    v1::WireReadRequest {
        request: Some(v1::ReadRequest {
            namespace: namespace.into(),
            keys: keys.iter().map(|k| Bytes::copy_from_slice(k)).collect(),
            ..Default::default()
        }),
        timeout_ms: 1000,
        max_reply_bytes: 0,
    }
    .encode_to_vec()
}

fn data_plane() -> Vec<(&'static str, Vec<u8>)> {
    let payload = b"0123456789abcdef".repeat(8);
    let (wmeta, wdata) = wire_write("fuzz", &[(b"k1", &payload), (b"k2", b"xyz")]);
    let hello = frame(
        Kind::Hello,
        1,
        &v1::WireHello { token: "t".into() }.encode_to_vec(),
        &[],
    );
    let write = frame(Kind::Write, 2, &wmeta, &wdata);
    let read = frame(
        Kind::Read,
        3,
        &wire_read("fuzz", &[b"k1", b"k2", b"missing"]),
        &[],
    );
    let session = [hello.clone(), write.clone(), read.clone()].concat();
    let mut oversized = frame(Kind::Write, 5, &wmeta, &[]);
    oversized[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    vec![
        ("hello", hello),
        ("write", write.clone()),
        ("read-miss", read),
        ("hello-write-read", session),
        (
            "map-read",
            frame(Kind::MapRead, 4, &wire_read("fuzz", &[b"k1"]), &[]),
        ),
        ("write-truncated", write[..write.len() - 7].to_vec()),
        ("write-oversized", oversized),
    ]
}

fn decode_request() -> Vec<(&'static str, Vec<u8>)> {
    let mut with_parent = pb_block(b"child", b"payload");
    with_parent.parent_key = Bytes::from_static(b"parent");
    with_parent.token_count = 16;
    with_parent.ttl_ms = 60_000;
    let mut bad_crc = pb_block(b"k", b"payload");
    bad_crc.crc32c ^= 1;
    let write = |blocks| {
        v1::WriteRequest {
            namespace: "fuzz".into(),
            blocks,
        }
        .encode_to_vec()
    };
    let chunk = kvstore::PromptChunk {
        hash: 7,
        partition_key: "p".into(),
        parent_hash: 3,
        buffer: Bytes::from_static(b"kv bytes"),
        tokens: (0..16).collect(),
        completion_id: "c".into(),
    };
    let d = records::digest(&chunk.tokens);
    vec![
        (
            "v1-write",
            write(vec![pb_block(b"k1", b"abc"), with_parent]),
        ),
        ("v1-write-bad-crc", write(vec![bad_crc])),
        (
            "v1-lookup-keys",
            v1::LookupRequest {
                namespace: "fuzz".into(),
                keys: vec![Bytes::from_static(b"k1"), Bytes::from_static(b"k2")],
                lease_ms: 100,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "v1-lookup-tokens",
            v1::LookupRequest {
                namespace: "fuzz".into(),
                tokens: (0..12).collect(),
                block_size: 4,
                hash: kvtier_core::HashFn::Sha256V1.name().into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "v1-read",
            v1::ReadRequest {
                namespace: "fuzz".into(),
                keys: vec![Bytes::from_static(b"k1")],
                lease_id: 9,
            }
            .encode_to_vec(),
        ),
        (
            "kvstore-write",
            kvstore::WriteRequest {
                resource_name: "r".into(),
                container_name: "c".into(),
                chunk: Some(chunk),
            }
            .encode_to_vec(),
        ),
        (
            "kvstore-lookup",
            kvstore::LookupRequest {
                resource_name: "r".into(),
                container_name: "c".into(),
                partition_key: "p".into(),
                completion_id: "c".into(),
                tokens: (0..256).collect(),
                precomputed_hashes: vec![1, 2],
            }
            .encode_to_vec(),
        ),
        (
            "kvstore-read",
            kvstore::ReadRequest {
                resource_name: "r".into(),
                container_name: "c".into(),
                location: records::location(&records::data_key(&d, 7)),
                completion_id: "c".into(),
            }
            .encode_to_vec(),
        ),
    ]
}

/// The `http_request` input: method index (GET, PUT, DELETE, HEAD, POST,
/// PATCH), path and query, NUL, body.
fn http(method: u8, target: &str, body: &[u8]) -> Vec<u8> {
    [&[method][..], target.as_bytes(), &[0], body].concat()
}

fn http_request() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("put", http(1, "v1/kv/fuzz/k1", b"value bytes")),
        ("put-ttl", http(1, "v1/kv/fuzz/k1?ttl_ms=60000", b"v")),
        ("put-bad-query", http(1, "v1/kv/fuzz/k1?nope=1", b"v")),
        ("get", http(0, "v1/kv/fuzz/k1", b"")),
        ("delete", http(2, "v1/kv/fuzz%2Fsub/k%20y", b"")),
        ("healthz", http(0, "healthz", b"")),
        ("metrics", http(0, "metrics", b"")),
    ]
}

fn record(parent: bool, expiry: bool, id: BlockId) -> Vec<u8> {
    let mut b = Block::new(
        id,
        parent.then(|| Key::new(b"parent".to_vec()).unwrap()),
        32,
        Bytes::from_static(b"payload of the block"),
    );
    if expiry {
        b.meta.expires_unix_ms = Some(4_102_444_800_000);
    }
    let mut out = format::encode_header(&b.meta, 42, b.payload.len() as u64);
    out.extend_from_slice(&b.payload);
    out
}

fn disk_header() -> Vec<(&'static str, Vec<u8>)> {
    let id = BlockId::new(
        Namespace::new("tenant/a").unwrap(),
        Key::new(vec![0xab; 32]).unwrap(),
    );
    let full = record(true, true, id.clone());
    vec![
        ("plain", record(false, false, id.clone())),
        ("parent-expiry", full.clone()),
        ("torn", full[..format::FIXED_LEN + 3].to_vec()),
    ]
}

fn object_decode() -> Vec<(&'static str, Vec<u8>)> {
    let other = BlockId::new(
        Namespace::new("fuzz/other").unwrap(),
        Key::new(b"k".to_vec()).unwrap(),
    );
    vec![
        ("object", record(false, false, fuzzing::object_id())),
        (
            "object-parent-expiry",
            record(true, true, fuzzing::object_id()),
        ),
        ("other-block", record(false, false, other)),
    ]
}

fn kvstore_location() -> Vec<(&'static str, Vec<u8>)> {
    let d = records::digest(&(0..128).collect::<Vec<i64>>());
    let loc = records::location(&records::data_key(&d, 0x0123_4567_89ab_cdef));
    vec![
        ("data", loc.clone().into_bytes()),
        ("data-upper", loc.to_ascii_uppercase().into_bytes()),
        (
            "version-key",
            records::location(&records::version_key(&d, 5)).into_bytes(),
        ),
    ]
}

/// Every target's seeds, by target name.
fn seeds() -> BTreeMap<&'static str, Vec<(&'static str, Vec<u8>)>> {
    BTreeMap::from([
        ("data_plane", data_plane()),
        ("decode_request", decode_request()),
        ("disk_header", disk_header()),
        ("http_request", http_request()),
        ("kvstore_location", kvstore_location()),
        ("object_decode", object_decode()),
    ])
}

/// The kinds of the frames the server sent.
fn reply_kinds(mut out: &[u8]) -> Vec<Kind> {
    let mut kinds = Vec::new();
    while out.len() >= HEADER_LEN {
        let h = Header::decode(out[..HEADER_LEN].try_into().unwrap()).unwrap();
        kinds.push(h.kind);
        out = &out[HEADER_LEN + h.meta_len as usize + h.data_len as usize..];
    }
    kinds
}

#[test]
fn seeds_reach_their_paths() {
    use Kind::*;
    let dp: BTreeMap<_, _> = data_plane().into_iter().collect();
    let kinds = |name: &str| reply_kinds(&fuzzing::data_plane_session(&dp[name]));
    assert_eq!(kinds("hello"), [HelloReply]);
    assert_eq!(kinds("write"), [WriteReply]);
    assert_eq!(
        kinds("hello-write-read"),
        [HelloReply, WriteReply, ReadReply]
    );
    assert_eq!(
        kinds("map-read"),
        [Error],
        "MapRead is for the same-host front only"
    );
    assert_eq!(kinds("write-oversized"), [Error]);
    assert!(kinds("write-truncated").is_empty());

    for (name, input) in http_request() {
        let want = match name {
            "put" | "put-ttl" => 204,
            "put-bad-query" => 400,
            "get" | "delete" => 404,
            _ => 200,
        };
        assert_eq!(fuzzing::http_request(&input), Some(want), "{name}");
    }

    for (name, input) in disk_header() {
        let h = format::decode_header(&input);
        match name {
            "torn" => assert_eq!(h, Err(format::HeaderError::Short)),
            _ => assert_eq!(h.expect(name).header_len + 20, input.len()),
        }
    }
    for (name, input) in object_decode() {
        let got = kvtier_object::decode_object(&fuzzing::object_id(), "seed", Bytes::from(input));
        assert_eq!(got.is_ok(), name != "other-block", "{name}: {got:?}");
    }
    for (name, input) in kvstore_location() {
        let got = records::parse_location(std::str::from_utf8(&input).unwrap());
        assert_eq!(got.is_some(), name != "version-key", "{name}");
    }
    for (name, input) in decode_request() {
        let ok = match name {
            n if n.starts_with("v1-write") => v1::WriteRequest::decode(&input[..]).is_ok(),
            n if n.starts_with("v1-lookup") => v1::LookupRequest::decode(&input[..]).is_ok(),
            "v1-read" => v1::ReadRequest::decode(&input[..]).is_ok(),
            "kvstore-write" => kvstore::WriteRequest::decode(&input[..]).is_ok(),
            "kvstore-lookup" => kvstore::LookupRequest::decode(&input[..]).is_ok(),
            _ => kvstore::ReadRequest::decode(&input[..]).is_ok(),
        };
        assert!(ok, "{name} decodes as what it is");
    }
}

#[test]
fn checked_in_seeds_are_current() {
    let write = std::env::var_os("KVTIER_WRITE_FUZZ_SEEDS").is_some();
    let mut stale = Vec::new();
    for (target, list) in seeds() {
        let dir = corpus_dir(target);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("seed-")
                {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
        for (name, bytes) in &list {
            let path = dir.join(format!("seed-{name}"));
            if write {
                std::fs::write(&path, bytes).unwrap();
            } else if std::fs::read(&path).ok().as_ref() != Some(bytes) {
                stale.push(path.display().to_string());
            }
        }
        let made: Vec<String> = list.iter().map(|(n, _)| format!("seed-{n}")).collect();
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name.starts_with("seed-") && !made.contains(&name) {
                stale.push(format!("{} (no longer made)", dir.join(name).display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "fuzz seeds differ from what the encoders make today: {stale:#?}\n\
         rewrite them: KVTIER_WRITE_FUZZ_SEEDS=1 cargo test -p kvtier-server --test fuzz_seeds"
    );
    let targets: Vec<&str> = fuzzing::TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        seeds().keys().copied().collect::<Vec<_>>(),
        targets,
        "every target has seeds"
    );
}
