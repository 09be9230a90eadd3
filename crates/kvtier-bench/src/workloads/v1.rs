//! A worker on `kvtier.v1` through the Rust client: each workload's unit as
//! v1 calls (lookups of key chains, reads and writes of blocks, text-key
//! get / set for `kv`, health checks for `ping`), with the server's timing
//! and shed refusals read from each answer.

use std::time::Instant;

use kvtier_client::WriteBlock;
use kvtier_core::Key;

use super::conn::{HealthClient, V1Client};
use super::{
    BLOCK_TOKENS, CONVERSATIONS, Ctx, KV_KEYS, Op, WorkerId, kv_key, kv_set_key, mix, req, sample,
};
use crate::load::{Sample, ServerTimes};

/// A worker on `kvtier.v1`.
pub struct V1Worker {
    pub(super) ctx: std::sync::Arc<Ctx>,
    pub(super) client: Box<V1Client>,
    pub(super) health: Option<HealthClient>,
    pub(super) id: WorkerId,
    /// Units run so far.
    pub(super) seq: u64,
}

fn v1_times(t: &kvtier_client::ServerTiming) -> ServerTimes {
    ServerTimes {
        queue_us: Some(t.queue_us),
        service_us: t.service_us,
        storage_us: t.storage_memory_us
            + t.storage_disk_us
            + t.storage_object_us
            + t.storage_peer_us,
        total_us: t.total_us,
    }
}

/// If a v1 call failed because the server shed it: the pause a client
/// takes before its next request.
fn shed_v1<T>(r: &Result<T, kvtier_client::ClientError>) -> Option<std::time::Duration> {
    match r {
        Err(kvtier_client::ClientError::Status(s)) if s.code() == tonic::Code::Unavailable => {
            Some(kvtier_client::retry_pause(0, s))
        }
        _ => None,
    }
}

impl V1Worker {
    async fn lookup(&mut self, keys: &[Key]) -> Sample {
        let c = &self.client;
        let sent = Instant::now();
        let r = c.lookup(&self.ctx.ns, keys, None).await;
        let mut s = sample("lookup", sent);
        s.shed = shed_v1(&r);
        if let Ok(l) = r {
            s.server = Some(v1_times(&l.timing));
            s.error = false;
        }
        s
    }

    async fn read(&mut self, op: &'static str, key: &Key) -> Sample {
        let c = &self.client;
        let sent = Instant::now();
        let r = c.read(&self.ctx.ns, std::slice::from_ref(key), 0).await;
        let mut s = sample(op, sent);
        s.shed = shed_v1(&r);
        if let Ok(r) = r {
            s.server = Some(v1_times(&r.timing));
            s.error = r.partial || r.blocks.is_empty();
            s.bytes = r.blocks.iter().map(|b| b.payload.len() as u64).sum();
            s.tokens = if op == "read" { BLOCK_TOKENS as u64 } else { 0 };
        }
        s
    }

    /// An engine loading a long prompt: one Lookup of the whole prefix, then
    /// one Read of what it found (striped by the client when long). One
    /// sample; an error unless every block came back.
    async fn prefix_read(&mut self, keys: &[Key]) -> Sample {
        let c = &self.client;
        let sent = Instant::now();
        let r = match c.lookup(&self.ctx.ns, keys, None).await {
            Ok(l) => c
                .read(&self.ctx.ns, &keys[..l.found], 0)
                .await
                .map(|r| (l, r)),
            Err(e) => Err(e),
        };
        let mut s = sample("prefix-read", sent);
        s.shed = shed_v1(&r);
        // No server-time split: a striped read is several requests in
        // parallel, whose server times do not add up to this wait.
        if let Ok((_, r)) = r {
            s.error = r.partial || r.blocks.len() != keys.len();
            s.bytes = r.blocks.iter().map(|b| b.payload.len() as u64).sum();
            s.tokens = (r.blocks.len() * BLOCK_TOKENS) as u64;
        }
        s
    }

    async fn write(&mut self, op: &'static str, key: Key, parent: Option<Key>) -> Sample {
        let c = &self.client;
        let b = WriteBlock {
            token_ids: Vec::new(),
            key,
            parent,
            token_count: if op == "write" {
                BLOCK_TOKENS as u32
            } else {
                0
            },
            payload: self.ctx.payload.clone(),
            ttl_ms: 0,
        };
        let sent = Instant::now();
        let r = c.write(&self.ctx.ns, &[b]).await;
        let mut s = sample(op, sent);
        s.shed = shed_v1(&r);
        if let Ok(w) = r {
            s.server = Some(v1_times(&w.timing));
            s.error = false;
            s.bytes = self.ctx.value_size as u64;
            s.tokens = if op == "write" {
                BLOCK_TOKENS as u64
            } else {
                0
            };
        }
        s
    }

    async fn ping(&mut self) -> Sample {
        let Some(h) = &mut self.health else {
            return sample("ping", Instant::now());
        };
        let sent = Instant::now();
        let r = h
            .check(req(tonic_health::pb::HealthCheckRequest::default()))
            .await;
        let mut s = sample("ping", sent);
        s.error = r.is_err();
        s
    }

    fn new_key(&self, u: u64) -> Key {
        let mut k = self.ctx.nonce.to_be_bytes().to_vec();
        k.extend_from_slice(&u.to_be_bytes());
        Key::new(k).expect("16 bytes")
    }

    pub(super) async fn unit(&mut self, out: &mut Vec<Sample>) {
        let ctx = self.ctx.clone();
        let (op, u, pick) = Op::next(&ctx, self.id, self.seq);
        match op {
            Op::Ping => out.push(self.ping().await),
            Op::Lookup => out.push(self.lookup(&ctx.chain_keys).await),
            Op::PrefixRead => out.push(self.prefix_read(&ctx.prefix_keys).await),
            Op::Read => out.push(self.read("read", &ctx.chain_keys[pick]).await),
            Op::Write => out.push(self.write("write", self.new_key(u), None).await),
            Op::Conversation => {
                let conv = &ctx.conv_keys[(u % CONVERSATIONS as u64) as usize];
                for _ in 0..7 {
                    out.push(self.lookup(conv).await);
                }
                for k in conv {
                    out.push(self.read("read", k).await);
                }
                for j in 0..3 {
                    let key = self.new_key(u.wrapping_mul(4) + j);
                    out.push(self.write("write", key, conv.last().cloned()).await);
                }
            }
            Op::Kv => {
                if self.seq.is_multiple_of(2) {
                    let k = kv_key(ctx.nonce, mix(u) % KV_KEYS as u64);
                    out.push(self.read("get", &k).await);
                } else {
                    out.push(self.write("set", kv_set_key(ctx.nonce, u), None).await);
                }
            }
        }
    }
}
