//! Client of the seed's `kvstore.KVStoreService` API.
//!
//! Existing clients of the seed service use their own generated stubs; this
//! module gives Rust callers (and `kvtier bench --api kvstore`) the same pooled
//! connections and deadlines as the native client, plus the chunking helpers:
//! a prompt is cut into 128-token chunks whose `hash` chains over the previous
//! chunk's hash (`xxh3_64(parent_hash LE || tokens as i64 LE)`, a client-side
//! convention: the server stores whatever hashes the writer supplies).
use crate::{ClientConfig, ClientError, Result, connect_pool};
use bytes::Bytes;
use kvtier_proto::kvstore as pb;
use kvtier_proto::kvstore::kv_store_service_client::KvStoreServiceClient;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tonic::transport::Channel;

pub use pb::{BlockLocation, PromptChunk, ServerMetrics};

/// Chunk hashes for the full 128-token (or `block_size`) blocks of `tokens`.
pub fn chunk_hashes(tokens: &[i64], block_size: usize) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::with_capacity(tokens.len() / block_size.max(1));
    for chunk in tokens.chunks_exact(block_size.max(1)) {
        let mut buf = Vec::with_capacity(8 + chunk.len() * 8);
        buf.extend_from_slice(&out.last().copied().unwrap_or(0).to_le_bytes());
        for t in chunk {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        out.push(xxhash_rust::xxh3::xxh3_64(&buf));
    }
    out
}

/// Builds the chunks of `tokens` (full blocks only) with their payloads.
pub fn chunks(
    tokens: &[i64],
    block_size: usize,
    payloads: &[Bytes],
    partition_key: &str,
) -> Vec<PromptChunk> {
    let hashes = chunk_hashes(tokens, block_size);
    hashes
        .iter()
        .enumerate()
        .zip(payloads)
        .map(|((i, h), p)| PromptChunk {
            hash: *h,
            partition_key: partition_key.to_string(),
            parent_hash: if i == 0 { 0 } else { hashes[i - 1] },
            buffer: p.clone(),
            tokens: tokens[i * block_size..(i + 1) * block_size].to_vec(),
            completion_id: String::new(),
        })
        .collect()
}

/// A pooled `kvstore.KVStoreService` client for one tenant.
#[derive(Clone)]
pub struct KvStoreClient {
    pool: Arc<Vec<KvStoreServiceClient<Channel>>>,
    next: Arc<AtomicUsize>,
    resource: String,
    container: String,
    timeout: std::time::Duration,
}

fn in_band(success: bool, error: &str) -> Result<()> {
    if success {
        Ok(())
    } else {
        Err(ClientError::Status(tonic::Status::unknown(format!(
            "server reported: {error}"
        ))))
    }
}

impl KvStoreClient {
    /// Connects a pool for tenant (`resource_name`, `container_name`).
    pub async fn connect(cfg: ClientConfig, resource: &str, container: &str) -> Result<Self> {
        let max = 512 << 20;
        let pool = connect_pool(&cfg)
            .await?
            .into_iter()
            .map(|c| {
                KvStoreServiceClient::new(c)
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max)
            })
            .collect();
        Ok(Self {
            pool: Arc::new(pool),
            next: Default::default(),
            resource: resource.to_string(),
            container: container.to_string(),
            timeout: cfg.timeout,
        })
    }

    fn conn(&self) -> KvStoreServiceClient<Channel> {
        self.pool[self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len()].clone()
    }

    fn req<T>(&self, m: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(m);
        r.set_timeout(self.timeout);
        r
    }

    /// Cached prefix of `tokens`: the raw response (errors in-band become `Err`).
    pub async fn lookup(&self, tokens: &[i64]) -> Result<pb::LookupResponse> {
        let r = self
            .conn()
            .lookup(self.req(pb::LookupRequest {
                resource_name: self.resource.clone(),
                container_name: self.container.clone(),
                tokens: tokens.to_vec(),
                ..Default::default()
            }))
            .await?
            .into_inner();
        in_band(r.success, &r.error)?;
        Ok(r)
    }

    /// Reads one location; `found = false` is returned as-is, not as an error.
    pub async fn read(&self, location: &str) -> Result<pb::ReadResponse> {
        let r = self
            .conn()
            .read(self.req(pb::ReadRequest {
                resource_name: self.resource.clone(),
                container_name: self.container.clone(),
                location: location.to_string(),
                completion_id: String::new(),
            }))
            .await?
            .into_inner();
        Ok(r)
    }

    /// Writes one chunk.
    pub async fn write(&self, chunk: PromptChunk) -> Result<pb::WriteResponse> {
        let r = self
            .conn()
            .write(self.req(pb::WriteRequest {
                resource_name: self.resource.clone(),
                container_name: self.container.clone(),
                chunk: Some(chunk),
            }))
            .await?
            .into_inner();
        in_band(r.success, &r.error)?;
        Ok(r)
    }

    /// Reads many locations over one pipelined StreamingRead; answers in order.
    pub async fn streaming_read(&self, locations: &[String]) -> Result<Vec<pb::ReadResponse>> {
        let reqs: Vec<pb::ReadRequest> = locations
            .iter()
            .map(|l| pb::ReadRequest {
                resource_name: self.resource.clone(),
                container_name: self.container.clone(),
                location: l.clone(),
                completion_id: String::new(),
            })
            .collect();
        let mut stream = self
            .conn()
            .streaming_read(self.req(tokio_stream::iter(reqs)))
            .await?
            .into_inner();
        let mut out = Vec::with_capacity(locations.len());
        while let Some(r) = stream.message().await? {
            out.push(r);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    /// Code outside this repository may still name the module's old path.
    #[test]
    #[allow(deprecated)]
    fn the_deprecated_compat_path_names_the_same_items() {
        use std::any::TypeId;
        assert_eq!(
            TypeId::of::<crate::compat::CompatClient>(),
            TypeId::of::<super::KvStoreClient>()
        );
        let tokens: Vec<i64> = (0..300).collect();
        assert_eq!(
            crate::compat::chunk_hashes(&tokens, 128),
            super::chunk_hashes(&tokens, 128)
        );
    }
}
