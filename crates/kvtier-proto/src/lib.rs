//! Generated protobuf and gRPC types.
//!
//! * [`v1`]: kvtier's own API (`kvtier.v1.KvTier`).
//! * [`kvstore`]: the seed service's API (`kvstore.KVStoreService`), served
//!   unchanged so existing clients can point at kvtier.
//! * [`wire`]: the data plane's framing (`KVW1` frames, docs/wire.md), shared
//!   by the server and the clients.
//! * [`bounded`]: request-size limits checked on the encoded message, before
//!   anything is decoded.

/// `kvtier.v1`: the native API.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("kvtier.v1");
}

/// `kvstore`: wire-compatible API of the seed service.
#[allow(missing_docs, clippy::all)]
pub mod kvstore {
    tonic::include_proto!("kvstore");
}

pub mod bounded;
pub mod wire;

/// The encoded `FileDescriptorSet` of every proto above, served by gRPC
/// server reflection so standard tools (grpcurl, grpcui, Postman, ghz) can
/// list and call the services without the `.proto` files.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/kvtier_descriptor.bin"));
