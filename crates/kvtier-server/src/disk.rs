//! Wiring of the disk tier (`[disk]`) into the engine: opening its directory,
//! which recovers the records there (docs/disk-format.md), and logging what
//! the recovery found.
use crate::config::Config;
use anyhow::Context;
use std::sync::Arc;

/// Adds the disk tier when `disk.dir` is set (recovering what it holds).
pub async fn attach(
    builder: kvtier_core::EngineBuilder,
    cfg: &Config,
) -> anyhow::Result<kvtier_core::EngineBuilder> {
    if cfg.disk.dir.is_empty() {
        return Ok(builder);
    }
    let d = &cfg.disk;
    let mut dc = kvtier_core::DiskConfig::new(&d.dir, d.capacity);
    dc.sync = d.sync;
    dc.batch_interval = d.batch_interval;
    dc.verify_on_open = d.verify_on_open;
    dc.shares = cfg.tenants.shares();
    dc.keep_tokens = cfg.events.enabled();
    let (disk, rep) = kvtier_core::DiskTier::open_async(dc)
        .await
        .context("disk tier")?;
    tracing::info!(
        dir = %d.dir,
        blocks = rep.blocks,
        bytes = rep.bytes,
        dropped = rep.dropped(),
        elapsed_ms = rep.elapsed.as_millis() as u64,
        "disk tier recovered"
    );
    Ok(builder.disk(Some(Arc::new(disk)), d.policy()?))
}
