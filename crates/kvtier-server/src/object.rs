//! Wiring of the object-store tier (`[object_store]`, per-namespace stores,
//! per-tenant stores from `[[kvstore.tenants]]`) into the engine.
use crate::config::Config;
use kvtier_core::{EngineBuilder, ObjectOptions};
use kvtier_object::{ObjectTier, ObjectTierConfig};
use std::sync::Arc;

/// The object-tier settings the config describes, or `None` when no store is
/// named; an error for an invalid codec (config load refuses those already,
/// this catches a `Config` built in code).
pub fn tier_config(cfg: &Config) -> anyhow::Result<Option<ObjectTierConfig>> {
    let o = &cfg.object_store;
    let mut namespaces: Vec<(String, String)> = o
        .namespaces
        .iter()
        .map(|n| (n.namespace.clone(), n.url.clone()))
        .collect();
    for t in &cfg.kvstore.tenants {
        if let Some(url) = &t.object_store {
            namespaces.push((t.namespace.clone(), url.clone()));
        }
    }
    if o.url.is_empty() && namespaces.is_empty() {
        return Ok(None);
    }
    let (compression, compression_namespaces) = o.codecs()?;
    Ok(Some(ObjectTierConfig {
        url: o.url.clone(),
        namespaces,
        options: o.options.clone(),
        timeout: o.timeout,
        request_timeout: o.request_timeout,
        connect_timeout: o.connect_timeout,
        max_retries: o.max_retries,
        negative_ttl: o.negative_cache_ttl,
        positive_ttl: o.positive_cache_ttl,
        cache_capacity: o.cache_capacity,
        compression,
        compression_namespaces,
        // A compressed object claiming more is refused before decoding.
        max_block_size: cfg.engine.max_block_size.bytes(),
    }))
}

/// Adds the configured object-store tier to `builder` (unchanged when none).
pub fn attach(builder: EngineBuilder, cfg: &Config) -> anyhow::Result<EngineBuilder> {
    let Some(tc) = tier_config(cfg)? else {
        return Ok(builder);
    };
    let o = &cfg.object_store;
    let tier = anyhow::Context::context(ObjectTier::open(tc), "object_store.url")?;
    let opts = ObjectOptions {
        policy: o.policy()?,
        queue_capacity: o.queue_capacity,
        upload_concurrency: o.upload_concurrency,
        lookup_concurrency: o.lookup_concurrency,
        lookup_timeout: o.lookup_timeout,
        enqueue_timeout: o.timeout,
        store_name: format!("object store {}", tier.describe()),
        read_ahead: o.read_ahead,
        prefetch: o.prefetch,
    };
    tracing::info!(stores = %tier.describe(), policy = %opts.policy,
        compression = %tier.config().compression,
        per_namespace = tier.config().compression_namespaces.len(),
        "object-store tier enabled");
    Ok(builder.object(Arc::new(tier), opts))
}
