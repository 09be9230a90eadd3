//! `kvtier demo`: drives a small multi-turn prompt workload against a running
//! server through the Rust client and writes a report.
//!
//! Each "turn" extends a conversation by a few 128-token blocks: look the whole
//! prompt up, read the cached prefix, "compute" the rest (skipped), write the new
//! blocks back. Reports hits, misses and client-side latencies with the server's
//! own timing beside them.
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use kvtier_client::ClientConfig;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `kvtier demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Server address.
    #[arg(
        long,
        short = 's',
        default_value = "http://127.0.0.1:50051",
        env = "KVTIER_SERVER"
    )]
    server: String,
    /// Conversations to run.
    #[arg(long, default_value_t = 8)]
    conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// New 128-token blocks per turn.
    #[arg(long, default_value_t = 2)]
    blocks_per_turn: usize,
    /// Payload bytes per block (KV tensors of 128 tokens).
    #[arg(long, default_value_t = 1_200_000)]
    block_bytes: usize,
    /// Where to write demo-report.json and demo-report.md.
    #[arg(long, default_value = "out/demo")]
    out: PathBuf,
}

struct Op {
    client: Histogram<u64>,
    server: Histogram<u64>,
}

impl Op {
    fn new() -> Self {
        Self {
            client: Histogram::new(3).expect("hist"),
            server: Histogram::new(3).expect("hist"),
        }
    }
    fn record(&mut self, client_us: u64, server_us: u64) {
        let _ = self.client.record(client_us.max(1));
        let _ = self.server.record(server_us.max(1));
    }
    fn json(&self) -> serde_json::Value {
        let p = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        serde_json::json!({
            "count": self.client.len(),
            "client_ms": { "p50": p(&self.client, 0.5), "p90": p(&self.client, 0.9), "p99": p(&self.client, 0.99), "max": self.client.max() as f64 / 1000.0 },
            "server_ms": { "p50": p(&self.server, 0.5), "p99": p(&self.server, 0.99) },
        })
    }
}

/// Runs the demo workload.
pub async fn run(a: DemoArgs) -> anyhow::Result<()> {
    let mut cfg = ClientConfig::new(a.server.clone());
    cfg.token = std::env::var("KVTIER_TOKEN").ok().filter(|t| !t.is_empty());
    cfg.tls = kvtier_client::ClientTls::from_env()?;
    if cfg.tls.is_none() {
        crate::cli::check_https_has_ca(&a.server, "KVTIER_TLS_CA=FILE")?;
    }
    let client = crate::cli::connect(cfg, &a.server).await?;
    let ns = "demo/llama-3-8b/bf16";
    let bs = client.config().block_size;
    let (mut lookup, mut read, mut write) = (Op::new(), Op::new(), Op::new());
    let (mut hit_blocks, mut miss_blocks, mut bytes_read) = (0u64, 0u64, 0u64);
    let mut by_tier: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let started = Instant::now();
    for conv in 0..a.conversations {
        // Every conversation shares a 2-block system prompt, then diverges.
        let mut tokens: Vec<u32> = (0..(2 * bs) as u32).collect();
        for turn in 0..a.turns {
            tokens.extend(
                (0..(a.blocks_per_turn * bs) as u32)
                    .map(|t| (conv as u32) << 20 | (turn as u32) << 12 | t),
            );
            let t0 = Instant::now();
            let l = client.lookup_tokens(ns, &tokens, Some(5_000)).await?;
            lookup.record(t0.elapsed().as_micros() as u64, l.timing.total_us);
            hit_blocks += l.found as u64;
            miss_blocks += (l.keys.len() - l.found) as u64;
            if l.found > 0 {
                let t0 = Instant::now();
                let r = client.read(ns, &l.keys[..l.found], l.lease_id).await?;
                read.record(t0.elapsed().as_micros() as u64, r.timing.total_us);
                anyhow::ensure!(
                    r.blocks.len() == l.found,
                    "read returned {} of {} blocks",
                    r.blocks.len(),
                    l.found
                );
                for b in &r.blocks {
                    anyhow::ensure!(
                        b.payload == payload(&b.key, a.block_bytes),
                        "block {} came back different",
                        b.key.to_hex()
                    );
                    bytes_read += b.payload.len() as u64;
                    *by_tier.entry(b.tier.as_str_name()).or_default() += 1;
                }
                // Read: the pins are no longer needed (as an engine does).
                if l.lease_id != 0 {
                    client.release_lease(l.lease_id).await?;
                }
            }
            // Write back the blocks the server did not have (the "computed" KV).
            let missing = &l.keys[l.found..];
            if !missing.is_empty() {
                let blocks: Vec<_> = missing
                    .iter()
                    .enumerate()
                    .map(|(j, k)| {
                        let i = l.found + j;
                        kvtier_client::WriteBlock {
                            token_ids: Vec::new(),
                            key: k.clone(),
                            parent: i.checked_sub(1).map(|p| l.keys[p].clone()),
                            token_count: bs as u32,
                            payload: payload(k, a.block_bytes),
                            ttl_ms: 0,
                        }
                    })
                    .collect();
                let t0 = Instant::now();
                let w = client.write(ns, &blocks).await?;
                write.record(t0.elapsed().as_micros() as u64, w.timing.total_us);
            }
        }
    }
    let wall = started.elapsed();
    let stats = client.stats().await?;
    let hit_rate = hit_blocks as f64 / (hit_blocks + miss_blocks).max(1) as f64;
    let report = serde_json::json!({
        "server": a.server,
        "conversations": a.conversations, "turns": a.turns, "block_bytes": a.block_bytes,
        "wall_s": wall.as_secs_f64(),
        "blocks_hit": hit_blocks, "blocks_missed": miss_blocks, "hit_rate": hit_rate,
        "tokens_served_from_cache": hit_blocks * bs as u64,
        "read_gbytes_per_s": bytes_read as f64 / wall.as_secs_f64() / 1e9,
        "blocks_read_by_tier": by_tier,
        "lookup": lookup.json(), "read": read.json(), "write": write.json(),
        "tiers": stats.tiers.iter().map(|t| serde_json::json!({
            "tier": kvtier_client::Tier::try_from(t.tier).map(|x| x.as_str_name()).unwrap_or("?"),
            "blocks": t.blocks, "bytes": t.bytes, "hits": t.hits, "evictions": t.evictions})).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(
        a.out.join("demo-report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let mut md = String::from("# kvtier demo report\n\n");
    md += &format!(
        "{} conversations × {} turns, {} new 128-token blocks per turn, {} bytes per block, against {}.\n\n",
        a.conversations, a.turns, a.blocks_per_turn, a.block_bytes, a.server
    );
    md += &format!(
        "Prefix blocks served from cache: **{hit_blocks}** (hit rate {:.0}%), missed and written back: **{miss_blocks}**; {:.0} cached tokens re-used instead of prefilled.\n\n",
        hit_rate * 100.0,
        (hit_blocks * bs as u64) as f64
    );
    let tiers: Vec<String> = by_tier
        .iter()
        .map(|(t, n)| format!("{n} from {}", t.trim_start_matches("TIER_").to_lowercase()))
        .collect();
    md += &format!(
        "Blocks read: {}.\n\n",
        if tiers.is_empty() {
            "none".to_string()
        } else {
            tiers.join(", ")
        }
    );
    md += "| op | count | client p50 ms | client p90 ms | client p99 ms | server p50 ms | server p99 ms |\n|---|---|---|---|---|---|---|\n";
    for (name, op) in [
        ("lookup", &lookup),
        ("read (whole cached prefix)", &read),
        ("write (new blocks)", &write),
    ] {
        let j = op.json();
        md += &format!(
            "| {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            j["count"],
            j["client_ms"]["p50"].as_f64().unwrap_or(0.0),
            j["client_ms"]["p90"].as_f64().unwrap_or(0.0),
            j["client_ms"]["p99"].as_f64().unwrap_or(0.0),
            j["server_ms"]["p50"].as_f64().unwrap_or(0.0),
            j["server_ms"]["p99"].as_f64().unwrap_or(0.0)
        );
    }
    std::fs::write(a.out.join("demo-report.md"), &md)?;
    crate::cli::print(format!(
        "{md}\nreport: {}\n",
        a.out.join("demo-report.md").display()
    ))?;
    Ok(())
}

/// Deterministic payload for a key, so reads can be verified byte for byte.
fn payload(key: &kvtier_core::Key, len: usize) -> Bytes {
    let mut seed = [7u8; 8];
    for (s, b) in seed.iter_mut().zip(key.as_bytes()) {
        *s = *b;
    }
    let mut x = u64::from_le_bytes(seed) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}
