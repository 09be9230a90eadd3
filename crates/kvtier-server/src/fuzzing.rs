//! The request-decoding path, as one function fuzzers and property tests drive:
//! protobuf decode of every request type of both gRPC APIs, then the same
//! validation the handlers run. It must never panic, and whatever validation
//! accepts must satisfy the invariants asserted here (a block that passes has a
//! payload matching its checksum, a valid key and a size within the limit).
use crate::grpc::v1::block_from_pb;
use crate::state;
use kvtier_core::Namespace;
use kvtier_proto::{kvstore, v1};
use prost::Message;

/// Largest block accepted by the fuzzed validation.
pub const FUZZ_MAX_BLOCK: u64 = 1 << 16;

/// Decodes `data` as each request type and validates what decodes.
pub fn decode_and_validate(data: &[u8]) {
    if let Ok(req) = v1::WriteRequest::decode(data)
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
    if let Ok(req) = v1::LookupRequest::decode(data) {
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
    if let Ok(req) = v1::ReadRequest::decode(data) {
        let _ = state::keys(&req.keys);
    }
    if let Ok(req) = kvstore::WriteRequest::decode(data) {
        let ns = crate::grpc::compat::tenant_namespace(&req.resource_name, &req.container_name);
        assert!(!ns.as_str().is_empty());
    }
    let _ = kvstore::LookupRequest::decode(data);
    let _ = kvstore::ReadRequest::decode(data);
}
