//! gRPC fronts: `kvtier.v1` ([`v1`]) and, on the same listeners, the seed's
//! `kvstore.KVStoreService`.
pub mod compat;
pub mod kvstore_records;
pub mod late;
pub(crate) mod listen;
pub mod v1;
