//! `kvstore.KVStoreService`: the seed service's wire API, served on the same
//! listeners as `kvtier.v1`, mapped onto the engine without special cases in it.
//!
//! The seed service addresses a block by its own 128 tokens and lets the same
//! tokens exist in several *versions* (one per distinct prefix); how those
//! are stored is [`super::kvstore_records`] (data `D`, version `M` and first
//! version `H` records per token digest).
//!
//! `Lookup` walks the prompt's full blocks: block 0 via `H d0`, block i via
//! `M di hash(i-1)`, stopping at the first miss. Locations are the hex of the
//! data key, so `Read(location)` is one engine read. Metadata entries are tiny,
//! so lookups never touch the 1.2 MB payloads.
//!
//! Errors are in-band (`success = false`, `error`), as in the original; the gRPC
//! status is OK. `ServerMetrics` are measured: storage = time inside the tiers,
//! total = request arrival to response ready, overhead = total − storage.
use super::kvstore_records as records;
use crate::config::KvStoreSection;
use crate::state::{self, Shared};
use crate::timing::Clock;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use kvtier_core::{Block, BlockId, Key, Namespace, WriteOutcome};
use kvtier_proto::kvstore as pb;
use kvtier_proto::kvstore::kv_store_service_server::KvStoreService;
use prost::Message;
use std::collections::HashMap;
use std::pin::Pin;
use std::time::Instant;
use tonic::{Request, Response, Status, Streaming};

const API: &str = "kvstore";

/// Requests of a StreamingRead processed concurrently (answers stay in order).
const STREAM_PIPELINE: usize = 16;

/// The service (named apart from the generated trait it implements,
/// `KvStoreService`).
#[derive(Clone)]
pub struct KvStoreApi {
    shared: Shared,
    block_size: usize,
    strict: bool,
    tenants: std::sync::Arc<HashMap<(String, String), Namespace>>,
}

/// An in-band error: reported as `success = false` with a message.
type InBand<T> = Result<T, String>;

fn metrics(clock: &Clock) -> pb::ServerMetrics {
    let t = clock.finish();
    let storage =
        (t.storage_memory_us + t.storage_disk_us + t.storage_object_us + t.storage_peer_us) as i64;
    let total = t.total_us as i64;
    pb::ServerMetrics {
        storage_latency_us: storage,
        total_latency_us: total,
        overhead_us: total - storage,
    }
}

/// Readable namespace for a tenant when both names are plain, else a hashed one.
pub fn tenant_namespace(resource: &str, container: &str) -> Namespace {
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 48
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    let name = if plain(resource) && plain(container) {
        format!("kvstore:{resource}/{container}")
    } else {
        let mut h = Vec::with_capacity(resource.len() + container.len() + 1);
        h.extend_from_slice(resource.as_bytes());
        h.push(0);
        h.extend_from_slice(container.as_bytes());
        format!("kvstore:h:{:032x}", xxhash_rust::xxh3::xxh3_128(&h))
    };
    Namespace::new(&name).expect("generated namespaces are valid")
}

impl KvStoreApi {
    /// Builds the service from the `[kvstore]` config section.
    pub fn new(shared: Shared, cfg: &KvStoreSection) -> anyhow::Result<Self> {
        let mut tenants = HashMap::new();
        for t in &cfg.tenants {
            let ns = Namespace::new(&t.namespace).map_err(|e| {
                anyhow::anyhow!(
                    "kvstore.tenants: {}/{}: {}",
                    t.resource_name,
                    t.container_name,
                    e.message
                )
            })?;
            tenants.insert((t.resource_name.clone(), t.container_name.clone()), ns);
        }
        Ok(Self {
            shared,
            block_size: cfg.block_size,
            strict: cfg.strict_tenants,
            tenants: std::sync::Arc::new(tenants),
        })
    }

    /// Tenants are namespaces: the same access rules apply. Refusals are
    /// gRPC statuses (UNAUTHENTICATED / PERMISSION_DENIED), not in-band errors.
    fn authorize(
        &self,
        who: &crate::auth::Principal,
        resource: &str,
        container: &str,
        write: bool,
    ) -> Result<(), Status> {
        match self.tenant(resource, container) {
            Ok(ns) => Ok(self.shared.allow(who, ns.as_str(), write)?),
            Err(_) => Ok(()), // unknown tenant: answered in band by the handler
        }
    }

    fn tenant(&self, resource: &str, container: &str) -> InBand<Namespace> {
        if let Some(ns) = self
            .tenants
            .get(&(resource.to_string(), container.to_string()))
        {
            return Ok(ns.clone());
        }
        if self.strict {
            return Err(format!(
                "unknown tenant resource_name={} container_name={} (strict_tenants is on)",
                clip(resource),
                clip(container)
            ));
        }
        Ok(tenant_namespace(resource, container))
    }

    async fn meta(&self, id: BlockId, clock: &mut Clock) -> InBand<Option<pb::PromptChunk>> {
        match self.shared.engine.read(&id, &mut clock.storage).await {
            Ok(Some((b, _))) => pb::PromptChunk::decode(b.payload)
                .map(Some)
                .map_err(|e| format!("stored metadata for {:?} is unreadable: {e}", id.key)),
            Ok(None) => Ok(None),
            Err(e) => Err(e.message),
        }
    }

    async fn lookup_inner(
        &self,
        req: pb::LookupRequest,
        clock: &mut Clock,
    ) -> InBand<pb::LookupResponse> {
        let ns = self.tenant(&req.resource_name, &req.container_name)?;
        let bs = self.block_size;
        let blocks = req.tokens.len() / bs;
        // Refused before any block is looked at, as kvtier.v1 does.
        let max = crate::messages::MAX_KEYS_PER_REQUEST;
        if blocks > max || req.precomputed_hashes.len() > max {
            return Err(format!(
                "{blocks} blocks of tokens and {} precomputed_hashes in one request; the limit is {max}",
                req.precomputed_hashes.len()
            ));
        }
        if !req.precomputed_hashes.is_empty() && req.precomputed_hashes.len() < blocks {
            return Err(format!(
                "precomputed_hashes has {} entries for {blocks} full blocks",
                req.precomputed_hashes.len()
            ));
        }
        let mut locations = Vec::new();
        let mut last_hash = 0u64;
        for (i, toks) in req.tokens.chunks_exact(bs).enumerate() {
            let d = records::digest(toks);
            let k = if i == 0 {
                records::first_key(&d)
            } else {
                records::version_key(&d, last_hash)
            };
            let Some(meta) = self.meta(BlockId::new(ns.clone(), k), clock).await? else {
                break;
            };
            if req
                .precomputed_hashes
                .get(i)
                .is_some_and(|h| *h != meta.hash)
            {
                break;
            }
            last_hash = meta.hash;
            locations.push(pb::BlockLocation {
                hash: meta.hash,
                location: records::location(&records::data_key(&d, meta.hash)),
            });
        }
        Ok(pb::LookupResponse {
            cached_blocks: locations.len() as i32,
            last_hash: if locations.is_empty() { 0 } else { last_hash },
            locations,
            error: String::new(),
            success: true,
            server_metrics: None,
        })
    }

    async fn read_inner(
        &self,
        req: pb::ReadRequest,
        clock: &mut Clock,
    ) -> InBand<pb::ReadResponse> {
        let ns = self.tenant(&req.resource_name, &req.container_name)?;
        // Checked by length before decoding, and never echoed in full.
        let key = records::parse_location(&req.location).ok_or_else(|| {
            format!(
                "malformed location {}: expected the 50-hex-digit string returned by Lookup",
                clip(&req.location)
            )
        })?;
        let id = BlockId::new(ns, key);
        let not_found = || pb::ReadResponse {
            found: false,
            chunk: None,
            error: format!("location {} not found", req.location),
            success: false,
            server_metrics: None,
        };
        let (b, _) = match self.shared.engine.read(&id, &mut clock.storage).await {
            Ok(Some(x)) => x,
            Ok(None) => return Ok(not_found()),
            Err(e) => return Err(e.message),
        };
        // The buffer is a zero-copy slice of the stored payload.
        let chunk = records::decode_data(b.payload.clone())
            .map_err(|e| format!("{e} (location {})", req.location))?;
        self.shared
            .metrics
            .bytes_out
            .inc_by(chunk.buffer.len() as u64);
        Ok(pb::ReadResponse {
            found: true,
            chunk: Some(chunk),
            error: String::new(),
            success: true,
            server_metrics: None,
        })
    }

    async fn write_inner(
        &self,
        req: pb::WriteRequest,
        clock: &mut Clock,
    ) -> InBand<pb::WriteResponse> {
        let ns = self.tenant(&req.resource_name, &req.container_name)?;
        let chunk = req.chunk.ok_or("WriteRequest has no chunk")?;
        if chunk.tokens.len() != self.block_size {
            return Err(format!(
                "chunk has {} tokens; blocks are exactly {} tokens",
                chunk.tokens.len(),
                self.block_size
            ));
        }
        self.shared
            .engine
            .check_size(chunk.buffer.len())
            .map_err(|e| e.context("chunk buffer").message)?;
        let d = records::digest(&chunk.tokens);
        let (hash, parent_hash, len) = (chunk.hash, chunk.parent_hash, chunk.buffer.len());
        let (data, meta) = records::encode(chunk);
        let engine = &self.shared.engine;
        let put = |k: Key, payload: Bytes| {
            Block::new(
                BlockId::new(ns.clone(), k),
                None,
                self.block_size as u32,
                payload,
            )
        };
        // Data first, then the metadata that makes it findable: a crash in between
        // leaves an unreachable data entry, never a lookup hit without data.
        let outcome = engine
            .write(put(records::data_key(&d, hash), data), &mut clock.storage)
            .await;
        map_write(outcome)?;
        map_write(
            engine
                .write(
                    put(records::version_key(&d, parent_hash), meta.clone()),
                    &mut clock.storage,
                )
                .await,
        )?;
        map_write(
            engine
                .write(put(records::first_key(&d), meta), &mut clock.storage)
                .await,
        )?;
        self.shared.metrics.bytes_in.inc_by(len as u64);
        Ok(pb::WriteResponse {
            success: true,
            error: String::new(),
            server_metrics: None,
        })
    }
}

/// A version already present is fine (writes are idempotent; the first version
/// of a (tokens, parent) pair wins).
fn map_write(r: kvtier_core::Result<WriteOutcome>) -> InBand<()> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.kind == kvtier_core::error::ErrorKind::FailedPrecondition => Ok(()),
        Err(e) => Err(e.message),
    }
}

/// `s` quoted, cut to 64 characters for error messages (a caller's bad
/// input can be megabytes; the answer should not be).
fn clip(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &s[..cut], s.len()),
    }
}

/// A response of this API: its outcome travels in-band.
trait InBandResponse: Default {
    fn success(&self) -> bool;
    fn fail(error: String) -> Self;
    fn set_metrics(&mut self, m: pb::ServerMetrics);
}

macro_rules! in_band {
    ($($ty:ident),*) => {$(
        impl InBandResponse for pb::$ty {
            fn success(&self) -> bool {
                self.success
            }
            #[allow(clippy::needless_update)]
            fn fail(error: String) -> Self {
                pb::$ty { error, success: false, ..Default::default() }
            }
            fn set_metrics(&mut self, m: pb::ServerMetrics) {
                self.server_metrics = Some(m);
            }
        }
    )*};
}
in_band!(LookupResponse, ReadResponse, WriteResponse);

/// The in-band response for `r`, its metrics filled in, with its outcome
/// code: `ok`, `not_found` (answered, nothing there) or `error`.
fn respond<T: InBandResponse>(r: InBand<T>, clock: &Clock) -> (T, &'static str) {
    let (mut resp, code) = match r {
        Ok(resp) => {
            let code = if resp.success() { "ok" } else { "not_found" };
            (resp, code)
        }
        Err(error) => (T::fail(error), "error"),
    };
    resp.set_metrics(metrics(clock));
    (resp, code)
}

impl KvStoreApi {
    /// Runs `f` as request `op` (see [`Shared::serve`]): a shed request is a
    /// gRPC error (clients retry it), everything else an in-band answer.
    async fn serve<T: InBandResponse>(
        &self,
        op: &'static str,
        arrived: Option<Instant>,
        f: impl AsyncFnOnce(&mut Clock) -> InBand<T>,
    ) -> Result<T, Status> {
        let code = |r: &Result<(T, &'static str), Status>| match r {
            Ok((_, code)) => (*code).into(),
            Err(s) => crate::status::code_name(s.code()).into(),
        };
        self.shared
            .serve(
                (API, op),
                arrived,
                |r| Err(r.into()),
                code,
                async |clock| {
                    let r = f(clock).await;
                    Ok(respond(r, clock))
                },
            )
            .await
            .map(|(resp, _)| resp)
    }

    async fn read_one(
        &self,
        req: pb::ReadRequest,
        arrived: Option<Instant>,
    ) -> Result<pb::ReadResponse, Status> {
        self.serve("read", arrived, async |clock| {
            self.read_inner(req, clock).await
        })
        .await
    }
}

type ReadStream = Pin<Box<dyn Stream<Item = Result<pb::ReadResponse, Status>> + Send>>;

#[tonic::async_trait]
impl KvStoreService for KvStoreApi {
    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        let who = self.shared.caller(super::credential(request.metadata()))?;
        let r = request.get_ref();
        self.authorize(&who, &r.resource_name, &r.container_name, false)?;
        let arrived = state::arrival(request.extensions());
        let req = request.into_inner();
        self.serve("lookup", arrived, async |clock| {
            self.lookup_inner(req, clock).await
        })
        .await
        .map(Response::new)
    }

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let who = self.shared.caller(super::credential(request.metadata()))?;
        let r = request.get_ref();
        self.authorize(&who, &r.resource_name, &r.container_name, false)?;
        let arrived = state::arrival(request.extensions());
        Ok(Response::new(
            self.read_one(request.into_inner(), arrived).await?,
        ))
    }

    async fn write(
        &self,
        request: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let who = self.shared.caller(super::credential(request.metadata()))?;
        let r = request.get_ref();
        self.authorize(&who, &r.resource_name, &r.container_name, true)?;
        let arrived = state::arrival(request.extensions());
        let req = request.into_inner();
        self.serve("write", arrived, async |clock| {
            self.write_inner(req, clock).await
        })
        .await
        .map(Response::new)
    }

    type StreamingReadStream = ReadStream;

    async fn streaming_read(
        &self,
        request: Request<Streaming<pb::ReadRequest>>,
    ) -> Result<Response<ReadStream>, Status> {
        let who = self.shared.caller(super::credential(request.metadata()))?;
        let this = self.clone();
        let inbound = request.into_inner();
        // Each message's clock starts when it is taken off the stream; answers are
        // produced concurrently but delivered in request order.
        let out = inbound
            .map(move |msg| {
                let this = this.clone();
                let who = who.clone();
                let arrived = Instant::now();
                async move {
                    let req = msg?;
                    this.authorize(&who, &req.resource_name, &req.container_name, false)?;
                    this.read_one(req, Some(arrived)).await
                }
            })
            .buffered(STREAM_PIPELINE);
        Ok(Response::new(Box::pin(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_namespaces_never_collide() {
        let a = tenant_namespace("acct", "c1");
        assert_eq!(a.as_str(), "kvstore:acct/c1");
        assert_ne!(tenant_namespace("a/b", "c"), tenant_namespace("a", "b/c"));
        assert_ne!(tenant_namespace("a b", "c"), tenant_namespace("a_b", "c"));
        assert!(tenant_namespace("", "").as_str().starts_with("kvstore:h:"));
    }

    #[test]
    fn clipping() {
        let long = "ab".repeat(1 << 19);
        let c = clip(&long);
        assert!(c.len() < 100 && c.ends_with("(1048576 bytes)"), "{c}");
        assert_eq!(clip("abc"), "\"abc\"");
    }

    proptest::proptest! {
        #[test]
        fn clipping_is_bounded_and_keeps_short_strings_whole(s in "\\PC{0,120}") {
            let c = clip(&s);
            // At most 64 characters, each escaped to at most 10 (\u{10ffff}).
            proptest::prop_assert!(c.chars().count() <= 64 * 10 + 40);
            if s.chars().count() <= 64 {
                proptest::prop_assert_eq!(c, format!("{s:?}"));
            } else {
                proptest::prop_assert!(c.ends_with(&format!("({} bytes)", s.len())), "{}", c);
            }
        }
    }
}
