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

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn object_store_compression_keys() {
        use kvtier_object::{Codec, codec::Dtype};
        let c = Config::parse(
            "[object_store]\nurl = \"memory://\"\ncompression = \"zstd-planes\"\n\
             [[object_store.compression_namespaces]]\nnamespace = \"acme/\"\ncodec = \"fp8-e4m3\"\ndtype = \"bf16\"\n\
             [[object_store.compression_namespaces]]\nnamespace = \"acme/exact\"\ncodec = \"off\"\n",
        )
        .unwrap();
        let tc = crate::object::tier_config(&c).unwrap().unwrap();
        assert_eq!(tc.compression, Codec::ZstdPlanes);
        assert_eq!(
            tc.compression_namespaces,
            vec![
                ("acme/".into(), Codec::Fp8E4m3(Dtype::Bf16)),
                ("acme/exact".into(), Codec::Off)
            ]
        );
        assert_eq!(tc.max_block_size, c.engine.max_block_size.bytes());
        assert_eq!(Config::default().object_store.compression, "off");
        let err = |t: &str| Config::parse(t).unwrap_err().to_string();
        let e = err("[object_store]\ncompression = \"fp8-e4m3\"\n");
        assert!(e.contains("only allowed per namespace"), "{e}");
        let e = err("[object_store]\ncompression = \"brotli\"\n");
        assert!(
            e.contains("\"brotli\"") && e.contains("off, zstd-planes, lz4-planes, fp8-e4m3"),
            "{e}"
        );
        let ns = |body: &str| {
            format!("[[object_store.compression_namespaces]]\nnamespace = \"a/\"\n{body}")
        };
        let e = err(&ns("codec = \"fp8-e4m3\"\n"));
        assert!(e.contains("dtype") && e.contains("\"a/\""), "{e}");
        let e = err(&ns("codec = \"fp8-e4m3\"\ndtype = \"fp32\"\n"));
        assert!(e.contains("fp32"), "{e}");
        let e = err(&ns("codec = \"zstd\"\n"));
        assert!(e.contains("valid: off, zstd-planes"), "{e}");
        let e = err(&ns("codec = \"lz4-planes\"\ndtype = \"bf16\"\n"));
        assert!(e.contains("fp8-e4m3 only"), "{e}");
        assert!(Config::parse(&ns("codec = \"lz4-planes\"\n")).is_ok());
    }
}
