//! `[disk]` and `[object_store]`: the tiers below memory, their write
//! policies and admission (docs/durability.md, docs/object-store.md,
//! docs/cache-choice.md).
use super::CompressionNamespace;
use kvtier_core::ByteSize;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[object_store]`: the shared, durable tier below disk. See docs/object-store.md.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectStoreSection {
    /// `az://container/prefix`, `s3://bucket/prefix`, `file:///dir`; empty
    /// disables the tier (unless `namespaces` or a tenant names a store).
    pub url: String,
    /// `write-back` (the default: acknowledged locally, uploaded by a bounded
    /// background queue) or `write-through` (acknowledged once in the store).
    pub write_policy: String,
    /// Which blocks are uploaded: `all` (the default, at their first write),
    /// `reuse` (at their second use) or `tinylfu` (once a frequency sketch
    /// counts two uses). See docs/cache-choice.md.
    pub admission: String,
    /// Longest one store call may take, retries included (the request
    /// deadline caps it further).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Longest one HTTP request to the store may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// TCP connect timeout.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Retries of a failed request (transient errors; backoff with jitter).
    pub max_retries: usize,
    /// Longest a lookup waits for the store's answers (request deadline caps it).
    #[serde(with = "humantime_serde")]
    pub lookup_timeout: Duration,
    /// Existence checks in flight at once per lookup.
    pub lookup_concurrency: usize,
    /// Write-back: blocks waiting for upload at most (then writes wait, then fail).
    pub queue_capacity: usize,
    /// Write-back: uploads in flight at once.
    pub upload_concurrency: usize,
    /// Blocks one prefix read keeps in flight from the store (notes/023).
    pub read_ahead: usize,
    /// A lookup that finds blocks only in the store starts reading them into
    /// memory before the client asks (notes/023).
    pub prefetch: bool,
    /// How long a "not in the store" answer is cached.
    #[serde(with = "humantime_serde")]
    pub negative_cache_ttl: Duration,
    /// How long an "in the store" answer is cached.
    #[serde(with = "humantime_serde")]
    pub positive_cache_ttl: Duration,
    /// Entries in the existence cache at most.
    pub cache_capacity: usize,
    /// `object_store` config keys applied after the environment, e.g.
    /// `aws_endpoint`, `aws_allow_http`, `azure_storage_use_emulator`.
    pub options: std::collections::BTreeMap<String, String>,
    /// Per-namespace stores: `[[object_store.namespaces]] namespace = "...", url = "..."`.
    pub namespaces: Vec<NamespaceStore>,
    /// Codec of stored objects for namespaces without their own entry:
    /// `off` (the default), `zstd-planes` or `lz4-planes` (lossless only).
    pub compression: String,
    /// Per-namespace codecs (the lossy `fp8-e4m3` only here), see
    /// `config::compression` and docs/object-store.md#compression.
    pub compression_namespaces: Vec<CompressionNamespace>,
}

/// One `[[object_store.namespaces]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceStore {
    /// kvtier namespace.
    pub namespace: String,
    /// Its store URL.
    pub url: String,
}

impl Default for ObjectStoreSection {
    fn default() -> Self {
        Self {
            url: String::new(),
            write_policy: "write-back".into(),
            admission: "all".into(),
            timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_retries: 3,
            lookup_timeout: Duration::from_secs(2),
            lookup_concurrency: 32,
            queue_capacity: 1024,
            upload_concurrency: 8,
            read_ahead: 16,
            prefetch: true,
            negative_cache_ttl: Duration::from_secs(2),
            positive_cache_ttl: Duration::from_secs(30),
            cache_capacity: 100_000,
            options: Default::default(),
            namespaces: Vec::new(),
            compression: "off".into(),
            compression_namespaces: Vec::new(),
        }
    }
}

impl ObjectStoreSection {
    /// The engine's write policy towards the store.
    pub fn policy(&self) -> anyhow::Result<kvtier_core::ObjectWritePolicy> {
        anyhow::Context::context(
            self.write_policy.parse::<kvtier_core::ObjectWritePolicy>(),
            "object_store.write_policy",
        )
    }

    /// Which blocks the store takes.
    pub fn admission(&self) -> anyhow::Result<kvtier_core::Admission> {
        anyhow::Context::context(self.admission.parse(), "object_store.admission")
    }

    /// The default codec and the per-namespace codecs, validated.
    pub fn codecs(
        &self,
    ) -> anyhow::Result<(kvtier_object::Codec, Vec<(String, kvtier_object::Codec)>)> {
        super::compression::codecs(&self.compression, &self.compression_namespaces)
    }
}

/// `[disk]`: the local disk tier below memory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiskSection {
    /// Directory holding the blocks; empty disables the disk tier.
    pub dir: String,
    /// Byte budget on disk.
    pub capacity: ByteSize,
    /// `always` (fsync before acknowledging; the default), `batch` (fsync every
    /// `batch_interval`), `never` (page cache only). See docs/durability.md.
    pub sync: kvtier_core::SyncMode,
    /// Flush interval for `sync = "batch"`.
    #[serde(with = "humantime_serde")]
    pub batch_interval: Duration,
    /// `write-through` (memory and disk before acknowledging; the default) or
    /// `write-back` (memory; demoted to disk on eviction).
    pub write_policy: String,
    /// Which blocks go to disk: `all` (the default), `reuse` (at their second
    /// use: a read or a re-write) or `tinylfu` (once a frequency sketch counts
    /// two uses). See docs/cache-choice.md.
    pub admission: String,
    /// Re-verify every payload checksum when rebuilding the index at start.
    pub verify_on_open: bool,
}

impl Default for DiskSection {
    fn default() -> Self {
        Self {
            dir: String::new(),
            capacity: ByteSize::gib(10),
            sync: kvtier_core::SyncMode::Always,
            batch_interval: Duration::from_millis(10),
            write_policy: "write-through".into(),
            admission: "all".into(),
            verify_on_open: true,
        }
    }
}

impl DiskSection {
    /// The engine's write policy.
    pub fn policy(&self) -> anyhow::Result<kvtier_core::WritePolicy> {
        match self.write_policy.as_str() {
            "write-through" => Ok(kvtier_core::WritePolicy::WriteThrough),
            "write-back" => Ok(kvtier_core::WritePolicy::WriteBack),
            other => {
                anyhow::bail!("disk.write_policy {other:?}: expected write-through or write-back")
            }
        }
    }

    /// Which blocks the disk tier takes.
    pub fn admission(&self) -> anyhow::Result<kvtier_core::Admission> {
        anyhow::Context::context(self.admission.parse(), "disk.admission")
    }
}
