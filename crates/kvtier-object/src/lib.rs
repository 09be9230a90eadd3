//! kvtier-object: the object-store tier (Azure Blob, S3 and S3-compatible
//! stores, local files) behind [`kvtier_core::Tier`], built on the
//! `object_store` crate. A separate crate so that `kvtier-core` (and its
//! engine benches) stays free of the HTTP/TLS stack.
//!
//! * Stores are named by URL: `az://container/prefix`, `s3://bucket/prefix`,
//!   `file:///dir`, `memory://` (tests). Credentials and endpoints come from
//!   each backend's standard environment variables (`AZURE_*`,
//!   `AZURITE_BLOB_STORAGE_URL`, `AWS_*`) as `object_store` reads them, then
//!   from [`ObjectTierConfig::options`] (the same keys, lower case).
//! * One object per block: the disk record header
//!   ([`kvtier_core::disk::format`]: namespace, key, parent, token count,
//!   crc32c, expiry, format version, header crc) followed by the payload, at
//!   `<prefix>/<namespace>/<key-hex>` (the namespace percent-encoded by
//!   `object_store`'s path rules). Objects are self-describing: any node can
//!   serve any block.
//! * Every read verifies the header checksum, that the object holds the block
//!   asked for, and the payload CRC32C; a corrupt object is a miss, never
//!   served (counted in `object_corrupt_total`).
//! * Every call is bounded: `object_store`'s per-request timeouts and retries
//!   (exponential backoff with jitter), and around them the request deadline
//!   ([`kvtier_core::deadline`]) or [`ObjectTierConfig::timeout`]. A store
//!   that cannot answer in time is `UNAVAILABLE` with a message naming it.
//! * Objects may be compressed ([`codec`], per namespace: lossless
//!   `zstd-planes` / `lz4-planes`, lossy `fp8-e4m3`): a version-2 record
//!   whose payload is a codec frame. Version-1 (raw) objects read as before.
//!   See docs/object-store.md#compression.
//! * `contains` (HEAD) answers from a small TTL'd cache first: misses for
//!   [`ObjectTierConfig::negative_ttl`], hits for
//!   [`ObjectTierConfig::positive_ttl`], at most
//!   [`ObjectTierConfig::cache_capacity`] entries.
//!
//! The engine decides when to call the tier (write policies, parallel
//! lookups): see `kvtier_core::object_link` and `docs/object-store.md`.
use async_trait::async_trait;
use bytes::Bytes;
use kvtier_core::block::{Block, BlockId};
use kvtier_core::disk::format;
use kvtier_core::tier::{PutOutcome, Tier, TierKind, TierStats};
use kvtier_core::{Error, Namespace, Result};
use object_store::path::{Path, PathPart};
use object_store::{ClientConfigKey, ObjectStore, RetryConfig};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod codec;
mod record;
pub mod testing;

pub use codec::Codec;
pub use record::{
    DEFAULT_MAX_BLOCK_SIZE, codec_for, decode_object, decode_object_limited, encode_object,
    encode_object_with,
};

/// Payloads at least this large are compressed and decompressed on the
/// blocking pool, not on a runtime worker (a 4 MiB block takes milliseconds).
const OFFLOAD_CODEC_AT: usize = 64 << 10;

/// The `object_store` crate this tier is built on (for tools and tests).
pub use object_store;

/// Settings of the object-store tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectTierConfig {
    /// Store for every namespace without its own entry; empty: only the
    /// namespaces in `namespaces` use an object store.
    pub url: String,
    /// Per-namespace stores (namespace, URL), e.g. one container per tenant.
    pub namespaces: Vec<(String, String)>,
    /// Extra `object_store` config keys (`aws_endpoint`, `azure_storage_use_emulator`,
    /// `aws_allow_http`, ...), applied after the environment.
    pub options: BTreeMap<String, String>,
    /// Longest one tier call may take, retries included (capped further by
    /// the request deadline).
    pub timeout: Duration,
    /// Longest one HTTP request may take.
    pub request_timeout: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Retries of a failed HTTP request (transient errors only).
    pub max_retries: usize,
    /// How long a "not in the store" answer is trusted.
    pub negative_ttl: Duration,
    /// How long an "in the store" answer is trusted.
    pub positive_ttl: Duration,
    /// Entries in the existence cache at most.
    pub cache_capacity: usize,
    /// Codec for objects of namespaces without an entry in
    /// `compression_namespaces` (lossless only; enforced by the server config).
    pub compression: Codec,
    /// Per-namespace codecs: (namespace, codec). A namespace matches exactly,
    /// or as a prefix when the entry ends in `/` or `:`; the longest wins.
    pub compression_namespaces: Vec<(String, Codec)>,
    /// Largest decoded payload a compressed object may claim; larger is
    /// refused (corrupt) before anything is allocated.
    pub max_block_size: u64,
}

impl Default for ObjectTierConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            namespaces: Vec::new(),
            options: BTreeMap::new(),
            timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_retries: 3,
            negative_ttl: Duration::from_secs(2),
            positive_ttl: Duration::from_secs(30),
            cache_capacity: 100_000,
            compression: Codec::Off,
            compression_namespaces: Vec::new(),
            max_block_size: DEFAULT_MAX_BLOCK_SIZE,
        }
    }
}

/// One configured store.
struct Store {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl Store {
    fn path(&self, id: &BlockId) -> Path {
        let ns = PathPart::from(id.namespace.as_str());
        let key = PathPart::from(kvtier_core_hex(id.key.as_bytes()));
        let mut parts: Vec<PathPart<'_>> = self.prefix.parts().collect();
        parts.push(ns);
        parts.push(key);
        Path::from_iter(parts)
    }
}

fn kvtier_core_hex(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(HEX[(x >> 4) as usize] as char);
        s.push(HEX[(x & 15) as usize] as char);
    }
    s
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    heads: AtomicU64,
    cache_hits: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    corrupt: AtomicU64,
    errors: AtomicU64,
    /// Payload bytes handed to PUTs, before compression.
    put_payload_bytes: AtomicU64,
    /// Payload bytes PUT after compression (frame included; raw = payload).
    put_stored_bytes: AtomicU64,
    /// PUTs whose codec gave no gain or did not apply (stored raw).
    put_uncompressed: AtomicU64,
}

/// The object-store tier. See the crate docs.
pub struct ObjectTier {
    cfg: ObjectTierConfig,
    default: Option<Store>,
    by_ns: HashMap<Namespace, Store>,
    /// id → (present, trusted until).
    cache: Mutex<HashMap<BlockId, (bool, Instant)>>,
    c: Counters,
}

impl std::fmt::Debug for ObjectTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectTier")
            .field("url", &self.cfg.url)
            .finish_non_exhaustive()
    }
}

/// Opens one store from its URL.
fn open_store(url: &str, cfg: &ObjectTierConfig) -> Result<Store> {
    let bad = |m: String| Error::invalid(format!("object store {url:?}: {m}"));
    let parsed = url::Url::parse(url).map_err(|e| bad(format!("not a URL: {e}")))?;
    let prefix_str = parsed.path().trim_matches('/');
    let prefix = Path::parse(prefix_str).map_err(|e| bad(format!("bad prefix: {e}")))?;
    let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
    let client = [
        (ClientConfigKey::Timeout, ms(cfg.request_timeout)),
        (ClientConfigKey::ConnectTimeout, ms(cfg.connect_timeout)),
    ];
    let retry = RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: cfg.max_retries,
        retry_timeout: cfg.timeout,
    };
    let built: Arc<dyn ObjectStore> = match parsed.scheme() {
        "s3" | "s3a" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let mut b = AmazonS3Builder::from_env().with_url(url).with_retry(retry);
            for (k, v) in &client {
                b = b.with_config(AmazonS3ConfigKey::Client(*k), v.clone());
            }
            for (k, v) in &cfg.options {
                let key = AmazonS3ConfigKey::from_str(k)
                    .map_err(|e| bad(format!("option {k:?}: {e}")))?;
                b = b.with_config(key, v.clone());
            }
            Arc::new(b.build().map_err(|e| bad(e.to_string()))?)
        }
        "az" | "azure" | "abfs" | "abfss" | "adl" => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry);
            for (k, v) in &client {
                b = b.with_config(AzureConfigKey::Client(*k), v.clone());
            }
            for (k, v) in &cfg.options {
                let key =
                    AzureConfigKey::from_str(k).map_err(|e| bad(format!("option {k:?}: {e}")))?;
                b = b.with_config(key, v.clone());
            }
            Arc::new(b.build().map_err(|e| bad(e.to_string()))?)
        }
        "file" => {
            let dir = parsed
                .to_file_path()
                .map_err(|_| bad("not a local path".into()))?;
            std::fs::create_dir_all(&dir)
                .map_err(|e| bad(format!("cannot create {}: {e}", dir.display())))?;
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| bad(e.to_string()))?;
            return Ok(Store {
                url: url.to_string(),
                store: Arc::new(fs),
                prefix: Path::default(),
            });
        }
        "memory" => Arc::new(object_store::memory::InMemory::new()),
        other => {
            return Err(bad(format!(
                "unsupported scheme {other:?}; expected az://, s3://, file:// or memory://"
            )));
        }
    };
    Ok(Store {
        url: url.to_string(),
        store: built,
        prefix,
    })
}

impl ObjectTier {
    /// Opens every configured store (no network traffic yet: a store that is
    /// down shows up on first use, as `UNAVAILABLE`).
    pub fn open(cfg: ObjectTierConfig) -> Result<Self> {
        let default = if cfg.url.is_empty() {
            None
        } else {
            Some(open_store(&cfg.url, &cfg)?)
        };
        let mut by_ns = HashMap::new();
        for (ns, url) in &cfg.namespaces {
            let ns = Namespace::new(ns)?;
            by_ns.insert(ns, open_store(url, &cfg)?);
        }
        if default.is_none() && by_ns.is_empty() {
            return Err(Error::invalid("object store tier: no URL configured"));
        }
        Ok(Self {
            cfg,
            default,
            by_ns,
            cache: Mutex::default(),
            c: Counters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ObjectTierConfig {
        &self.cfg
    }

    /// Human-readable name of the stores (their URLs).
    pub fn describe(&self) -> String {
        let mut v: Vec<&str> = self.default.iter().map(|s| s.url.as_str()).collect();
        v.extend(self.by_ns.values().map(|s| s.url.as_str()));
        v.join(", ")
    }

    fn store_for(&self, ns: &Namespace) -> Option<&Store> {
        self.by_ns.get(ns).or(self.default.as_ref())
    }

    /// The store and object path of a block (None when its namespace has no store).
    pub fn locate(&self, id: &BlockId) -> Option<(Arc<dyn ObjectStore>, Path)> {
        self.store_for(&id.namespace)
            .map(|s| (s.store.clone(), s.path(id)))
    }

    /// Forgets cached existence answers (tests, operators).
    pub fn clear_cache(&self) {
        self.cache.lock().clear();
    }

    fn remember(&self, id: &BlockId, present: bool) {
        let ttl = if present {
            self.cfg.positive_ttl
        } else {
            self.cfg.negative_ttl
        };
        if ttl.is_zero() || self.cfg.cache_capacity == 0 {
            return;
        }
        let now = Instant::now();
        let mut c = self.cache.lock();
        if c.len() >= self.cfg.cache_capacity && !c.contains_key(id) {
            c.retain(|_, (_, until)| *until > now);
            if c.len() >= self.cfg.cache_capacity {
                c.clear();
            }
        }
        c.insert(id.clone(), (present, now + ttl));
    }

    fn cached(&self, id: &BlockId) -> Option<bool> {
        let c = self.cache.lock();
        c.get(id)
            .and_then(|(p, until)| (*until > Instant::now()).then_some(*p))
    }

    /// Runs one store call within the budget; `Ok(None)` for "not found".
    async fn call<T>(
        &self,
        store: &Store,
        op: &str,
        path: &Path,
        f: impl Future<Output = object_store::Result<T>>,
    ) -> Result<Option<T>> {
        let budget = kvtier_core::deadline::budget(self.cfg.timeout);
        let fail = |m: String| {
            self.c.errors.fetch_add(1, Ordering::Relaxed);
            Err(Error::unavailable(m))
        };
        if budget.is_zero() {
            return fail(format!(
                "object store {}: request deadline passed before {op} {path}",
                store.url
            ));
        }
        match tokio::time::timeout(budget, f).await {
            Err(_) => fail(format!(
                "object store {} did not answer {op} {path} within {} ms",
                store.url,
                budget.as_millis()
            )),
            Ok(Err(object_store::Error::NotFound { .. })) => Ok(None),
            Ok(Err(e)) => fail(format!(
                "object store {} unavailable: {op} {path} failed: {e}",
                store.url
            ))
            .map_err(|err| err.with_source(e)),
            Ok(Ok(v)) => Ok(Some(v)),
        }
    }

    /// The codec for a namespace's objects.
    pub fn codec_for(&self, ns: &Namespace) -> Codec {
        codec_for(&self.cfg, ns.as_str())
    }

    async fn decode(
        &self,
        id: &BlockId,
        path: &Path,
        buf: Bytes,
    ) -> std::result::Result<Block, String> {
        let max = self.cfg.max_block_size;
        // Raw (version-1) objects decode inline as they always did: a CRC32C
        // pass is not worth a thread hop. Only compressed ones are offloaded.
        let compressed = buf.get(4..6) == Some(&format::VERSION_CODEC.to_le_bytes()[..]);
        if !compressed || buf.len() < OFFLOAD_CODEC_AT {
            return decode_object_limited(id, path.as_ref(), buf, max);
        }
        let (id, name) = (id.clone(), path.to_string());
        tokio::task::spawn_blocking(move || decode_object_limited(&id, &name, buf, max))
            .await
            .unwrap_or_else(|e| Err(format!("decoder task failed: {e}")))
    }
}

#[async_trait]
impl Tier for ObjectTier {
    fn kind(&self) -> TierKind {
        TierKind::Object
    }

    async fn get(&self, id: &BlockId) -> Result<Option<Block>> {
        let Some(store) = self.store_for(&id.namespace) else {
            return Ok(None);
        };
        let path = store.path(id);
        self.c.gets.fetch_add(1, Ordering::Relaxed);
        let fetch = async {
            let r = store.store.get(&path).await?;
            r.bytes().await
        };
        let Some(buf) = self.call(store, "GET", &path, fetch).await? else {
            self.c.misses.fetch_add(1, Ordering::Relaxed);
            self.remember(id, false);
            return Ok(None);
        };
        match self.decode(id, &path, buf).await {
            Ok(b) if b.expired_at(kvtier_core::memory::unix_ms()) => {
                self.c.misses.fetch_add(1, Ordering::Relaxed);
                self.remember(id, false);
                Ok(None)
            }
            Ok(b) => {
                self.c.hits.fetch_add(1, Ordering::Relaxed);
                self.remember(id, true);
                Ok(Some(b))
            }
            Err(m) => {
                self.c.corrupt.fetch_add(1, Ordering::Relaxed);
                self.c.misses.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(store = %store.url, object = %path, problem = %m,
                    "corrupt object in the object store: not served (read is a miss)");
                // Lookups stop counting it for a while, too.
                self.remember(id, false);
                Ok(None)
            }
        }
    }

    async fn contains(&self, id: &BlockId) -> Result<bool> {
        let Some(store) = self.store_for(&id.namespace) else {
            return Ok(false);
        };
        if let Some(p) = self.cached(id) {
            self.c.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(p);
        }
        let path = store.path(id);
        self.c.heads.fetch_add(1, Ordering::Relaxed);
        let present = self
            .call(store, "HEAD", &path, store.store.head(&path))
            .await?
            .is_some();
        self.remember(id, present);
        Ok(present)
    }

    async fn put(&self, block: Block) -> Result<PutOutcome> {
        let id = block.meta.id.clone();
        let Some(store) = self.store_for(&id.namespace) else {
            return Ok(PutOutcome::Stored);
        };
        let path = store.path(&id);
        self.c.puts.fetch_add(1, Ordering::Relaxed);
        let codec = self.codec_for(&id.namespace);
        let raw = block.payload.len() as u64;
        let (payload, stored) = if codec == Codec::Off {
            (encode_object(&block), raw)
        } else if block.payload.len() < OFFLOAD_CODEC_AT {
            encode_object_with(&block, codec)
        } else {
            tokio::task::spawn_blocking(move || encode_object_with(&block, codec))
                .await
                .map_err(|e| Error::internal(format!("object encoder task failed: {e}")))?
        };
        self.c.put_payload_bytes.fetch_add(raw, Ordering::Relaxed);
        self.c.put_stored_bytes.fetch_add(stored, Ordering::Relaxed);
        if codec != Codec::Off && stored == raw {
            self.c.put_uncompressed.fetch_add(1, Ordering::Relaxed);
        }
        self.call(store, "PUT", &path, store.store.put(&path, payload))
            .await?;
        self.remember(&id, true);
        Ok(PutOutcome::Stored)
    }

    async fn delete(&self, id: &BlockId) -> Result<u64> {
        let Some(store) = self.store_for(&id.namespace) else {
            return Ok(0);
        };
        let path = store.path(id);
        self.c.deletes.fetch_add(1, Ordering::Relaxed);
        let existed = self
            .call(store, "HEAD", &path, store.store.head(&path))
            .await?
            .is_some();
        if existed {
            self.call(store, "DELETE", &path, store.store.delete(&path))
                .await?;
        }
        self.remember(id, false);
        Ok(existed as u64)
    }

    fn stats(&self) -> TierStats {
        TierStats {
            hits: self.c.hits.load(Ordering::Relaxed),
            misses: self.c.misses.load(Ordering::Relaxed),
            ..Default::default()
        }
    }

    fn extra_counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        let c = &self.c;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            (
                "object_gets",
                "GET requests sent to the object store",
                l(&c.gets),
            ),
            (
                "object_heads",
                "HEAD requests sent to the object store (lookups)",
                l(&c.heads),
            ),
            (
                "object_head_cache_hits",
                "Existence checks answered by the tier's TTL cache",
                l(&c.cache_hits),
            ),
            (
                "object_puts",
                "PUT requests sent to the object store",
                l(&c.puts),
            ),
            (
                "object_deletes",
                "Deletes sent to the object store",
                l(&c.deletes),
            ),
            (
                "object_corrupt",
                "Objects that failed their checksums (not served)",
                l(&c.corrupt),
            ),
            (
                "object_errors",
                "Object-store calls that failed or timed out (UNAVAILABLE)",
                l(&c.errors),
            ),
            (
                "object_put_payload_bytes",
                "Block payload bytes PUT to the object store, before compression",
                l(&c.put_payload_bytes),
            ),
            (
                "object_put_stored_bytes",
                "Bytes PUT to the object store after compression (headers excluded)",
                l(&c.put_stored_bytes),
            ),
            (
                "object_put_uncompressed",
                "PUTs under a codec stored raw (no gain, odd length, NaN/Inf for fp8)",
                l(&c.put_uncompressed),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::Key;
    use object_store::PutPayload;

    fn block(ns: &str, k: &str, payload: &'static [u8]) -> Block {
        let id = BlockId::new(
            Namespace::new(ns).unwrap(),
            Key::new(Bytes::copy_from_slice(k.as_bytes())).unwrap(),
        );
        Block::new(id, None, 16, Bytes::from_static(payload))
    }

    fn tier(url: String) -> ObjectTier {
        ObjectTier::open(ObjectTierConfig {
            url,
            ..Default::default()
        })
        .unwrap()
    }

    #[tokio::test]
    async fn roundtrip_on_local_files_and_paths_are_readable() {
        let dir = tempfile::tempdir().unwrap();
        let t = tier(format!("file://{}", dir.path().display()));
        let b = block("tenant/a:b", "k1", b"hello object store");
        assert!(!t.contains(&b.meta.id).await.unwrap());
        t.put(b.clone()).await.unwrap();
        assert!(
            t.contains(&b.meta.id).await.unwrap(),
            "negative cache entry replaced by the put"
        );
        let got = t.get(&b.meta.id).await.unwrap().unwrap();
        assert_eq!(got, b);
        let (_, path) = t.locate(&b.meta.id).unwrap();
        assert_eq!(path.as_ref(), "tenant%2Fa:b/6b31");
        assert_eq!(t.delete(&b.meta.id).await.unwrap(), 1);
        assert!(t.get(&b.meta.id).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn corrupt_and_misplaced_objects_are_misses() {
        let t = tier("memory://".into());
        let b = block("n", "k", b"payload bytes");
        t.put(b.clone()).await.unwrap();
        let (store, path) = t.locate(&b.meta.id).unwrap();
        let mut raw = store
            .get(&path)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        let last = raw.len() - 1;
        raw[last] ^= 0x40;
        store.put(&path, PutPayload::from(raw)).await.unwrap();
        assert!(t.get(&b.meta.id).await.unwrap().is_none());
        assert_eq!(
            t.extra_counters()
                .iter()
                .find(|c| c.0 == "object_corrupt")
                .unwrap()
                .2,
            1
        );
        // Another block's object under this block's name: not served either.
        let other = block("n", "other", b"x");
        store.put(&path, encode_object(&other)).await.unwrap();
        assert!(t.get(&b.meta.id).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn per_namespace_stores() {
        let cfg = ObjectTierConfig {
            url: String::new(),
            namespaces: vec![("only".into(), "memory://".into())],
            ..Default::default()
        };
        let t = ObjectTier::open(cfg).unwrap();
        let a = block("only", "k", b"a");
        let b = block("elsewhere", "k", b"b");
        t.put(a.clone()).await.unwrap();
        t.put(b.clone()).await.unwrap();
        assert!(t.get(&a.meta.id).await.unwrap().is_some());
        assert!(
            t.get(&b.meta.id).await.unwrap().is_none(),
            "namespace without a store is local-only"
        );
        assert!(ObjectTier::open(ObjectTierConfig::default()).is_err());
        let e = ObjectTier::open(ObjectTierConfig {
            url: "ftp://x/y".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.message.contains("unsupported scheme"), "{e}");
    }

    #[tokio::test]
    async fn unreachable_store_is_unavailable_within_the_deadline() {
        // A port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = ObjectTierConfig {
            url: "s3://bucket/p".into(),
            ..Default::default()
        };
        for (k, v) in [
            ("aws_endpoint", format!("http://127.0.0.1:{port}")),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "x".into()),
            ("aws_secret_access_key", "y".into()),
            ("aws_region", "us-east-1".into()),
        ] {
            cfg.options.insert(k.into(), v);
        }
        let t = ObjectTier::open(cfg).unwrap();
        let b = block("n", "k", b"p");
        let t0 = Instant::now();
        let deadline = Instant::now() + Duration::from_millis(300);
        let e = kvtier_core::deadline::scope(Some(deadline), t.get(&b.meta.id))
            .await
            .unwrap_err();
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(e.kind, kvtier_core::error::ErrorKind::Unavailable);
        assert!(e.message.contains("s3://bucket/p"), "{e}");
    }
}
