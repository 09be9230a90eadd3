//! gRPC fronts: `kvtier.v1` ([`v1`]) and, on the same listeners, the seed's
//! `kvstore.KVStoreService`.
pub mod authn;
pub mod kvstore;
pub mod kvstore_records;
pub mod late;
pub(crate) mod listen;
pub mod v1;

use crate::state::Credential;
use std::time::Instant;

/// What a gRPC request says about its caller: its `authorization` metadata
/// and the cluster's forwarding mark.
pub fn credential(md: &tonic::metadata::MetadataMap) -> Credential<'_> {
    Credential {
        authorization: md.get("authorization").and_then(|v| v.to_str().ok()),
        forwarded: md.contains_key(crate::cluster::FORWARDED),
    }
}

/// The request deadline from the `grpc-timeout` header, if the client set one.
pub fn deadline(md: &tonic::metadata::MetadataMap, arrived: Instant) -> Option<Instant> {
    let timeout = crate::timing::grpc_timeout(md.get("grpc-timeout")?.to_str().ok()?)?;
    arrived.checked_add(timeout)
}
