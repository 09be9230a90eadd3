//! A multi-turn chat against the seed's kvstore API, in the shape of the
//! seed's playground: each turn looks the whole conversation up, reads the
//! cached blocks, "computes" the rest (the caller's job) and writes back the
//! new full 128-token blocks. Used by `examples/conversation` and by
//! `kvtier bench --workload conversation`.
use crate::Result;
use crate::kvstore::{KvStoreClient, chunk_hashes};
use bytes::Bytes;
use kvtier_proto::kvstore::PromptChunk;
use std::time::{Duration, Instant};

/// What one turn did and how long each step took (client-side).
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// Full blocks in the prompt this turn.
    pub blocks: usize,
    /// Blocks found cached (prefix).
    pub hits: usize,
    /// Blocks not cached (written back).
    pub misses: usize,
    /// Lookup latency.
    pub lookup: Duration,
    /// Latency of each block read.
    pub reads: Vec<Duration>,
    /// Latency of each block write.
    pub writes: Vec<Duration>,
    /// Payload bytes read.
    pub bytes_read: u64,
}

/// One conversation's growing prompt.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// Every token so far.
    pub tokens: Vec<i64>,
    /// Tokens per block.
    pub block_size: usize,
}

impl Conversation {
    /// An empty conversation with `block_size`-token blocks (128 in the seed).
    pub fn new(block_size: usize) -> Self {
        Self {
            tokens: Vec::new(),
            block_size,
        }
    }

    /// Appends `new_tokens` and runs one turn. `payload(i, hash)` produces the
    /// KV bytes of block `i` (what the engine's prefill would have computed).
    pub async fn turn(
        &mut self,
        client: &KvStoreClient,
        new_tokens: &[i64],
        payload: impl Fn(usize, u64) -> Bytes,
    ) -> Result<Turn> {
        self.tokens.extend_from_slice(new_tokens);
        let bs = self.block_size;
        let hashes = chunk_hashes(&self.tokens, bs);
        let mut t = Turn {
            blocks: hashes.len(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let l = client.lookup(&self.tokens).await?;
        t.lookup = t0.elapsed();
        t.hits = l.cached_blocks.max(0) as usize;
        t.misses = hashes.len() - t.hits.min(hashes.len());
        for loc in &l.locations {
            let t0 = Instant::now();
            let r = client.read(&loc.location).await?;
            t.reads.push(t0.elapsed());
            if let Some(c) = r.chunk {
                t.bytes_read += c.buffer.len() as u64;
            }
        }
        for i in t.hits..hashes.len() {
            let chunk = PromptChunk {
                hash: hashes[i],
                partition_key: String::new(),
                parent_hash: if i == 0 { 0 } else { hashes[i - 1] },
                buffer: payload(i, hashes[i]),
                tokens: self.tokens[i * bs..(i + 1) * bs].to_vec(),
                completion_id: String::new(),
            };
            let t0 = Instant::now();
            client.write(chunk).await?;
            t.writes.push(t0.elapsed());
        }
        Ok(t)
    }
}
