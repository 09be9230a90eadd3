//! The choices a sweep is made of on the kvtier side: the [`Workload`] (what
//! one unit of work is), the [`Api`] it goes through and, for `kvtier.v1`,
//! the [`Transport`] of Read and Write. Each parses its command-line name and
//! serialises under it (worker specs carry them to child processes).

use serde::{Deserialize, Serialize};

/// What one unit of work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// 64-block chain lookups.
    Lookup,
    /// Single-block reads.
    Read,
    /// Single-block writes.
    Write,
    /// Lookup, read, write in turn.
    Mixed,
    /// Seed 001's iteration.
    Conversation,
    /// 100-byte get/set (v1 only).
    Kv,
    /// Empty round trips (health check).
    Ping,
    /// Lookup and ping in turn.
    LookupPing,
    /// One Lookup + Read of a whole long prefix ([`super::PREFIX_BLOCKS`]
    /// blocks), as an engine loading a long prompt (v1 only).
    PrefixRead,
}

impl Workload {
    /// Parses a workload name.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "lookup" => Workload::Lookup,
            "read" => Workload::Read,
            "write" => Workload::Write,
            "mixed" => Workload::Mixed,
            "conversation" => Workload::Conversation,
            "kv" => Workload::Kv,
            "ping" => Workload::Ping,
            "lookup-ping" => Workload::LookupPing,
            "prefix-read" => Workload::PrefixRead,
            _ => anyhow::bail!(
                "unknown workload {s:?}: expected lookup, read, write, mixed, conversation, kv, \
                 ping, lookup-ping or prefix-read"
            ),
        })
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lookup => "lookup",
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::Mixed => "mixed",
            Workload::Conversation => "conversation",
            Workload::Kv => "kv",
            Workload::Ping => "ping",
            Workload::LookupPing => "lookup-ping",
            Workload::PrefixRead => "prefix-read",
        }
    }

    /// Default payload per block: 1.2 MB (seed 000), 512 B for `conversation`
    /// (seed 001), 100 B for `kv` (seed 004).
    pub fn default_value_size(self) -> u64 {
        match self {
            Workload::Conversation => 512,
            Workload::Kv => 100,
            _ => 1_200_000,
        }
    }
}

/// Which kvtier API is exercised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `kvtier.v1` through the Rust client.
    V1,
    /// `kvstore.KVStoreService` (the seed's API) through a tonic client.
    KvStore,
}

impl Api {
    /// Parses `v1` / `kvstore`; `grpc` and `compat` (the old names, still
    /// in notes' commands) too.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "v1" | "grpc" => Ok(Api::V1),
            "kvstore" | "compat" => Ok(Api::KvStore),
            _ => anyhow::bail!("unknown api {s:?}: expected v1 or kvstore"),
        }
    }

    /// The record's `api` string: `v1+grpc` / `v1+wire` (Read and Write over
    /// the data plane, the rest over gRPC) / `kvstore-compat`. That last one
    /// keeps its old name: it is data, like a metric label, and the records
    /// under notes/ (notes/005) carry it, so a re-run matches them.
    pub fn record_name(self, wire: bool) -> &'static str {
        match (self, wire) {
            (Api::V1, false) => "v1+grpc",
            (Api::V1, true) => "v1+wire",
            (Api::KvStore, _) => "kvstore-compat",
        }
    }
}

/// How `kvtier.v1` Read/Write travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// The data plane when the server advertises one, else gRPC.
    #[default]
    Auto,
    /// gRPC only (`ClientConfig::data_plane = false`).
    Grpc,
    /// The data plane; an error when the server has none.
    DataPlane,
}

impl Transport {
    /// Parses `auto` / `grpc` / `data-plane` (`wire`).
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "auto" => Ok(Transport::Auto),
            "grpc" => Ok(Transport::Grpc),
            "data-plane" | "wire" => Ok(Transport::DataPlane),
            _ => anyhow::bail!("unknown transport {s:?}: expected auto, grpc or data-plane"),
        }
    }
}
