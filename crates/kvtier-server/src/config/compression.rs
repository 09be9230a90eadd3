//! `[object_store] compression` and `[[object_store.compression_namespaces]]`:
//! which codec stores each namespace's objects (docs/object-store.md,
//! "Compression"; the codecs are `kvtier_object::codec`).
//!
//! The lossy `fp8-e4m3` changes the bytes a read serves, so it is accepted
//! only per namespace, where an operator opted that namespace in (and named
//! its 16-bit dtype, which the server cannot know); never as the default.
use kvtier_object::Codec;
use serde::{Deserialize, Serialize};

/// One `[[object_store.compression_namespaces]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CompressionNamespace {
    /// A namespace, or a prefix ending in `/` or `:` (every namespace under
    /// it). The longest matching entry wins; an exact one beats prefixes.
    pub namespace: String,
    /// `off`, `zstd-planes`, `lz4-planes` or `fp8-e4m3`.
    pub codec: String,
    /// `bf16` or `fp16`: the payload's values (required by `fp8-e4m3` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

/// The default codec and the per-namespace ones, validated.
pub fn codecs(
    default: &str,
    entries: &[CompressionNamespace],
) -> anyhow::Result<(Codec, Vec<(String, Codec)>)> {
    if default == "fp8-e4m3" {
        anyhow::bail!(
            "object_store.compression: fp8-e4m3 is lossy and only allowed per namespace \
             ([[object_store.compression_namespaces]] with a dtype), never as the default; \
             the default may be off, zstd-planes or lz4-planes"
        );
    }
    let d = Codec::parse(default, None)
        .map_err(|e| anyhow::anyhow!("object_store.compression: {e}"))?;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let what = || format!("object_store.compression_namespaces {:?}", e.namespace);
        if e.namespace.is_empty() {
            anyhow::bail!("{}: the namespace is empty", what());
        }
        let c = Codec::parse(&e.codec, e.dtype.as_deref())
            .map_err(|m| anyhow::anyhow!("{}: {m}", what()))?;
        if out.iter().any(|(n, _): &(String, Codec)| *n == e.namespace) {
            anyhow::bail!("{}: given twice", what());
        }
        out.push((e.namespace.clone(), c));
    }
    Ok((d, out))
}
