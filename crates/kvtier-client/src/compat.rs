//! Client of the seed-compatible `kvstore.KVStoreService` API (see the compat front).
