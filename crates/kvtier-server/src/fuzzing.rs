//! The entry points the fuzz targets (fuzz/fuzz_targets/), the corpus replay
//! test (tests/fuzz_corpus.rs) and the property tests drive, one per target
//! ([`TARGETS`]; fuzz/README.md says how each is run). Each must never panic
//! and asserts its parser's invariants.
//!
//! The request-decoding path ([`decode_and_validate`]): protobuf decode of
//! every request type of both gRPC APIs (with the list limits checked first,
//! as the servers' codec does), then the same validation the handlers run;
//! whatever validation accepts must satisfy the invariants asserted there (a
//! block that passes has a payload matching its checksum, a valid key and a
//! size within the limit).
use crate::messages::block_from_pb;
use crate::state;
use kvtier_core::{BlockId, Key, Namespace};
use kvtier_proto::{bounded, kvstore, v1};

/// Largest block accepted by the fuzzed validation.
pub const FUZZ_MAX_BLOCK: u64 = 1 << 16;

/// A fuzz target's function of one input.
pub type Target = fn(&[u8]);

/// Every fuzz target by its name in fuzz/Cargo.toml, and the function it
/// runs on one input. The replay test sends each file of
/// `fuzz/corpus/<name>/` and `fuzz/regressions/<name>/` through these.
pub const TARGETS: &[(&str, Target)] = &[
    ("data_plane", |d| {
        data_plane_session(d);
    }),
    ("decode_request", decode_and_validate),
    ("disk_header", disk_header),
    ("http_request", |d| {
        http_request(d);
    }),
    ("kvstore_location", kvstore_location),
    ("object_decode", object_decode),
];

/// The namespace of [`object_id`].
pub const OBJECT_NAMESPACE: &str = "fuzz/ns";
/// The key of [`object_id`].
pub const OBJECT_KEY: &[u8] = b"k";

/// The block [`object_decode`] asks for.
pub fn object_id() -> BlockId {
    BlockId::new(
        Namespace::new(OBJECT_NAMESPACE).expect("a valid namespace"),
        Key::new(OBJECT_KEY.to_vec()).expect("a valid key"),
    )
}

/// Decodes `data` as each request type and validates what decodes.
pub fn decode_and_validate(data: &[u8]) {
    if let Ok(req) = bounded::decode::<v1::WriteRequest>(data)
        && let Ok(ns) = Namespace::new(&req.namespace)
    {
        for (i, b) in req.blocks.into_iter().enumerate() {
            let (crc, len) = (b.crc32c, b.payload.len());
            if let Ok(block) = block_from_pb(&ns, i, b, FUZZ_MAX_BLOCK) {
                assert_eq!(
                    crc32c::crc32c(&block.payload),
                    crc,
                    "accepted block with a bad checksum"
                );
                assert!(len as u64 <= FUZZ_MAX_BLOCK);
                assert!(!block.meta.id.key.as_bytes().is_empty());
                assert!(block.meta.id.key.as_bytes().len() <= kvtier_core::keys::MAX_KEY_LEN);
            }
        }
    }
    if let Ok(req) = bounded::decode::<v1::LookupRequest>(data) {
        let _ = state::namespace(&req.namespace);
        let _ = state::keys(&req.keys);
        if let Ok(h) = kvtier_core::HashFn::parse(&req.hash) {
            let bs = if req.block_size == 0 {
                128
            } else {
                req.block_size as usize
            };
            if let Ok(keys) = h.chain(&req.tokens, bs) {
                assert_eq!(keys.len(), req.tokens.len() / bs);
            }
        }
    }
    if let Ok(req) = bounded::decode::<v1::ReadRequest>(data) {
        let _ = state::keys(&req.keys);
    }
    if let Ok(req) = bounded::decode::<kvstore::WriteRequest>(data) {
        let ns = crate::grpc::kvstore::tenant_namespace(&req.resource_name, &req.container_name);
        assert!(!ns.as_str().is_empty());
    }
    let _ = bounded::decode::<kvstore::LookupRequest>(data);
    let _ = bounded::decode::<kvstore::ReadRequest>(data);
}

/// Runs the data plane's connection loop (framing, Hello, Read, Write,
/// request-memory reservation, timeouts) over an in-memory stream that
/// carries `input` and then ends, and returns what the server sent. Asserts
/// that the session ends (within 10 s: no hang) and that the output is a
/// sequence of whole, valid reply frames.
pub fn data_plane_session(input: &[u8]) -> Vec<u8> {
    use kvtier_core::{ByteSize, Engine, EngineConfig};
    use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async {
        let engine = Engine::new(EngineConfig {
            memory_capacity: ByteSize::mib(16),
            max_block_size: ByteSize(FUZZ_MAX_BLOCK),
            ..Default::default()
        });
        let mut shared = crate::state::Shared::new(std::sync::Arc::new(engine), 8);
        shared.limits = crate::limits::Limits::new(
            4 << 20,
            8,
            Duration::from_millis(500),
            Duration::from_millis(500),
        );
        let (server_end, mut client_end) = tokio::io::duplex(1 << 16);
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(crate::wire::connection(
            server_end,
            shared,
            FUZZ_MAX_BLOCK * 4,
            stop,
            crate::limits::Conns::new(1, 1, 0)
                .admit(None)
                .expect("an empty table admits"),
        ));
        let input = input.to_vec();
        let session = async move {
            let (mut rd, mut wr) = tokio::io::split(&mut client_end);
            let write = async {
                let _ = wr.write_all(&input).await;
                let _ = wr.shutdown().await;
            };
            let mut out = Vec::new();
            let read = rd.read_to_end(&mut out);
            let (_, r) = tokio::join!(write, read);
            let _ = r;
            out
        };
        let out = tokio::time::timeout(Duration::from_secs(10), session)
            .await
            .expect("the data-plane session ended");
        let _ = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the connection task ended");
        out
    });
    let mut rest = &out[..];
    while !rest.is_empty() {
        assert!(rest.len() >= HEADER_LEN, "a partial frame header was sent");
        let h = Header::decode(rest[..HEADER_LEN].try_into().expect("24 bytes"))
            .expect("the server sends valid headers");
        assert!(
            matches!(
                h.kind,
                Kind::ReadReply | Kind::WriteReply | Kind::HelloReply | Kind::Error
            ),
            "the server sent a request frame {:?}",
            h.kind
        );
        let len = HEADER_LEN + h.meta_len as usize + h.data_len as usize;
        assert!(rest.len() >= len, "a partial frame was sent");
        rest = &rest[len..];
    }
    out
}

/// Sends one HTTP request made from `input` through the HTTP API's router
/// (an in-process server with a 16 MiB memory tier): the first byte picks
/// the method, the bytes up to the first NUL are the path and query, the
/// rest is the body. Inputs that do not form a URI a client could send are
/// ignored. Asserts that the answer is not a 5xx (bad paths, namespaces,
/// keys and queries are the client's error) and comes within 10 s; returns
/// the status.
pub fn http_request(input: &[u8]) -> Option<u16> {
    use tower::ServiceExt;
    const METHODS: [&str; 6] = ["GET", "PUT", "DELETE", "HEAD", "POST", "PATCH"];
    let (&m, rest) = input.split_first()?;
    let (target, body) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let target = std::str::from_utf8(target).ok()?;
    let uri = format!("/{}", target.trim_start_matches('/'));
    let req = http::Request::builder()
        .method(METHODS[m as usize % METHODS.len()])
        .uri(&uri)
        .body(axum::body::Body::from(body.to_vec()))
        .ok()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let status = rt.block_on(async {
        let engine = kvtier_core::Engine::new(kvtier_core::EngineConfig {
            memory_capacity: kvtier_core::ByteSize::mib(16),
            max_block_size: kvtier_core::ByteSize(FUZZ_MAX_BLOCK),
            ..Default::default()
        });
        let shared = state::Shared::new(std::sync::Arc::new(engine), 8);
        let answer = crate::http::router(shared).oneshot(req);
        tokio::time::timeout(std::time::Duration::from_secs(10), answer)
            .await
            .expect("the HTTP API answered within 10 s")
            .expect("the router is infallible")
            .status()
    });
    assert!(!status.is_server_error(), "{uri} -> {status}");
    Some(status.as_u16())
}

/// Decodes the disk record header (also the object store's object header,
/// docs/disk-format.md): a header or an error, never a panic, and a decoded
/// header lies within the bytes it was decoded from.
pub fn disk_header(data: &[u8]) {
    if let Ok(h) = kvtier_core::disk::format::decode_header(data) {
        assert!(h.header_len <= data.len(), "a header longer than its input");
    }
}

/// Decodes `data` as the object fetched for [`object_id`]: that block,
/// whole and checksummed, or an error.
pub fn object_decode(data: &[u8]) {
    let id = object_id();
    if let Ok(b) = kvtier_object::decode_object(&id, "fuzz", bytes::Bytes::copy_from_slice(data)) {
        assert_eq!(b.meta.id, id);
        b.verify().expect("a decoded object verifies");
    }
}

/// Parses `data` as a kvstore `Read` location: a string either names a data
/// key, and is then exactly the location `Lookup` gives for that key (in
/// any case of its hex digits), or is refused.
pub fn kvstore_location(data: &[u8]) {
    use crate::grpc::kvstore_records::{location, parse_location};
    if let Ok(s) = std::str::from_utf8(data)
        && let Some(k) = parse_location(s)
    {
        assert_eq!(location(&k), s.to_ascii_lowercase());
    }
}
