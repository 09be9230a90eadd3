//! The data a workload touches, named by the run's nonce alone: [`Ctx`]
//! derives the payload and the chain / conversation / key names from it,
//! writes them once per run ([`Ctx::preload`]) and finds them again in every
//! process ([`Ctx::discover`]) — through either API.

use anyhow::Context;
use bytes::Bytes;
use kvtier_client::WriteBlock;
use kvtier_core::Key;
use kvtier_proto::kvstore as pb;

use super::conn::kvstore_client;
use super::{
    BLOCK_TOKENS, CHAIN_BLOCKS, CONV_BLOCKS, CONVERSATIONS, Conn, KV_KEYS, PREFIX_BLOCKS, Workload,
    block_hash, kv_key, mix, stream_chain, stream_conv, stream_prefix, tokens,
};

/// Shared, read-only state of a workload in one process.
pub struct Ctx {
    /// The workload.
    pub workload: Workload,
    /// Payload bytes per block.
    pub value_size: usize,
    /// Run nonce.
    pub nonce: u64,
    pub(super) payload: Bytes,
    /// `kvtier.v1` namespace of the run's data.
    pub(super) ns: String,
    /// `kvstore` resource name.
    pub(super) resource: String,
    /// `kvstore` container name (per run).
    pub(super) container: String,
    /// Keys of the preloaded chain (v1).
    pub(super) chain_keys: Vec<Key>,
    /// Keys of each preloaded conversation (v1).
    pub(super) conv_keys: Vec<Vec<Key>>,
    /// Keys of the long prefix `prefix-read` loads (v1).
    pub(super) prefix_keys: Vec<Key>,
    /// Locations of the preloaded chain's blocks (`kvstore`).
    pub(super) chain_locs: Vec<String>,
}

impl Ctx {
    /// Deterministic state for `nonce`; [`Ctx::preload`] writes it, [`Ctx::discover`] finds it.
    pub fn new(workload: Workload, value_size: usize, nonce: u64) -> Self {
        let mut p = vec![0u8; value_size];
        for (i, chunk) in p.chunks_mut(8).enumerate() {
            let v = mix(nonce ^ i as u64).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ctx {
            workload,
            value_size,
            nonce,
            payload: Bytes::from(p),
            ns: format!("bench/{nonce:016x}"),
            resource: "bench".into(),
            container: format!("c{nonce:016x}"),
            chain_keys: Vec::new(),
            conv_keys: Vec::new(),
            prefix_keys: Vec::new(),
            chain_locs: Vec::new(),
        }
    }

    /// The payload every write sends.
    pub fn payload(&self) -> Bytes {
        self.payload.clone()
    }

    pub(super) fn needs_chain(&self) -> bool {
        matches!(
            self.workload,
            Workload::Lookup | Workload::Read | Workload::Mixed | Workload::LookupPing
        )
    }

    /// Writes what the workload reads (once per run, by the parent).
    pub async fn preload(&mut self, conn: &Conn) -> anyhow::Result<()> {
        let n = self.nonce;
        match conn {
            Conn::V1(c, _) => {
                let chains = [
                    (self.needs_chain(), stream_chain(), CHAIN_BLOCKS),
                    (
                        self.workload == Workload::PrefixRead,
                        stream_prefix(),
                        PREFIX_BLOCKS,
                    ),
                ];
                for (_, stream, blocks) in chains.into_iter().filter(|c| c.0) {
                    let keys = c.keys_for(&tokens(n, stream, blocks * BLOCK_TOKENS));
                    for (i, k) in keys.iter().enumerate() {
                        let b = WriteBlock {
                            token_ids: Vec::new(),
                            key: k.clone(),
                            parent: i.checked_sub(1).map(|p| keys[p].clone()),
                            token_count: BLOCK_TOKENS as u32,
                            payload: self.payload.clone(),
                            ttl_ms: 0,
                        };
                        c.write(&self.ns, &[b]).await.context("preload chain")?;
                    }
                }
                if self.workload == Workload::Conversation {
                    for conv in 0..CONVERSATIONS {
                        let t = tokens(n, stream_conv(conv), CONV_BLOCKS * BLOCK_TOKENS);
                        let payloads = vec![self.payload.clone(); CONV_BLOCKS];
                        c.write_tokens(&self.ns, &t, &payloads)
                            .await
                            .context("preload conversations")?;
                    }
                }
                if self.workload == Workload::Kv {
                    for chunk in (0..KV_KEYS as u64).collect::<Vec<_>>().chunks(100) {
                        let blocks: Vec<WriteBlock> = chunk
                            .iter()
                            .map(|i| WriteBlock {
                                token_ids: Vec::new(),
                                key: kv_key(n, *i),
                                parent: None,
                                token_count: 0,
                                payload: self.payload.clone(),
                                ttl_ms: 0,
                            })
                            .collect();
                        c.write(&self.ns, &blocks).await.context("preload kv")?;
                    }
                }
            }
            Conn::KvStore(chans) => {
                anyhow::ensure!(
                    self.workload != Workload::Kv,
                    "the kv workload needs --api v1 (the kvstore API has no text keys)"
                );
                anyhow::ensure!(
                    self.workload != Workload::PrefixRead,
                    "the prefix-read workload needs --api v1 (the kvstore API reads one block per call)"
                );
                let mut c = kvstore_client(chans[0].clone());
                let mut write_chain = async |stream: u64, blocks: usize| -> anyhow::Result<()> {
                    let t = tokens(n, stream, blocks * BLOCK_TOKENS);
                    let mut parent = 0;
                    for (i, toks) in t.chunks(BLOCK_TOKENS).enumerate() {
                        let hash = block_hash(n, stream, i);
                        let r = c
                            .write(pb::WriteRequest {
                                resource_name: self.resource.clone(),
                                container_name: self.container.clone(),
                                chunk: Some(pb::PromptChunk {
                                    hash,
                                    parent_hash: parent,
                                    buffer: self.payload.clone(),
                                    tokens: toks.iter().map(|x| i64::from(*x)).collect(),
                                    ..Default::default()
                                }),
                            })
                            .await?
                            .into_inner();
                        anyhow::ensure!(r.success, "preload write failed: {}", r.error);
                        parent = hash;
                    }
                    Ok(())
                };
                if self.needs_chain() {
                    write_chain(stream_chain(), CHAIN_BLOCKS).await?;
                }
                if self.workload == Workload::Conversation {
                    for conv in 0..CONVERSATIONS {
                        write_chain(stream_conv(conv), CONV_BLOCKS).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Finds the preloaded data (keys, kvstore locations) without writing.
    pub async fn discover(&mut self, conn: &Conn) -> anyhow::Result<()> {
        let n = self.nonce;
        match conn {
            Conn::V1(c, _) => {
                self.chain_keys =
                    c.keys_for(&tokens(n, stream_chain(), CHAIN_BLOCKS * BLOCK_TOKENS));
                self.prefix_keys =
                    c.keys_for(&tokens(n, stream_prefix(), PREFIX_BLOCKS * BLOCK_TOKENS));
                self.conv_keys = (0..CONVERSATIONS)
                    .map(|conv| {
                        c.keys_for(&tokens(n, stream_conv(conv), CONV_BLOCKS * BLOCK_TOKENS))
                    })
                    .collect();
            }
            Conn::KvStore(chans) => {
                if self.needs_chain() {
                    let mut c = kvstore_client(chans[0].clone());
                    let r = c
                        .lookup(self.kvstore_lookup(stream_chain(), CHAIN_BLOCKS))
                        .await?
                        .into_inner();
                    anyhow::ensure!(
                        r.success && r.locations.len() == CHAIN_BLOCKS,
                        "preloaded chain not found ({} of {CHAIN_BLOCKS} blocks; {})",
                        r.locations.len(),
                        r.error
                    );
                    self.chain_locs = r.locations.into_iter().map(|l| l.location).collect();
                }
            }
        }
        Ok(())
    }

    pub(super) fn kvstore_lookup(&self, stream: u64, blocks: usize) -> pb::LookupRequest {
        pb::LookupRequest {
            resource_name: self.resource.clone(),
            container_name: self.container.clone(),
            tokens: tokens(self.nonce, stream, blocks * BLOCK_TOKENS)
                .into_iter()
                .map(i64::from)
                .collect(),
            ..Default::default()
        }
    }
}
