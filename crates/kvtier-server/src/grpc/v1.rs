//! `kvtier.v1.KvTier`: translates protobuf requests into engine calls.
use crate::auth::Principal;
use crate::state::{self, Shared};
use crate::status::{result_code, to_status};
use crate::timing::Clock;
use futures::Stream;
use kvtier_core::{Block, BlockId, HashFn, Key, WriteOutcome};
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_server::KvTier;
use std::borrow::Cow;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

pub use crate::messages::MAX_KEYS_PER_REQUEST;
use crate::messages::{block_from_pb, check_count, tier};

const API: &str = "v1";

/// The service implementation.
#[derive(Clone)]
pub struct V1Service {
    shared: Shared,
}

impl V1Service {
    /// Wraps the shared state.
    pub fn new(shared: Shared) -> Self {
        Self { shared }
    }

    /// This service as a request sees it: one forwarded by another node of
    /// the cluster is served from this node's tiers only ([`Shared::route`]).
    fn routed(&self, md: &tonic::metadata::MetadataMap) -> Cow<'_, V1Service> {
        match self.shared.route(super::credential(md)) {
            Cow::Borrowed(_) => Cow::Borrowed(self),
            Cow::Owned(shared) => Cow::Owned(V1Service { shared }),
        }
    }

    /// Runs `f` as request `op` of this API (see [`Shared::serve`]).
    async fn serve<T>(
        &self,
        op: &'static str,
        arrived: Option<Instant>,
        f: impl AsyncFnOnce(&mut Clock) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        self.shared
            .serve((API, op), arrived, |r| Err(r.into()), result_code, f)
            .await
            .map(Response::new)
    }
}

impl V1Service {
    async fn lookup_inner(
        &self,
        who: &Principal,
        req: pb::LookupRequest,
        clock: &mut Clock,
    ) -> Result<pb::LookupResponse, Status> {
        let ns = state::namespace(&req.namespace)?;
        self.shared.allow(who, ns.as_str(), false)?;
        let engine = &self.shared.engine;
        let keys = match (req.keys.is_empty(), req.tokens.is_empty()) {
            (false, false) => {
                return Err(Status::invalid_argument(
                    "give either keys or tokens, not both",
                ));
            }
            (false, true) => {
                check_count(req.keys.len())?;
                state::keys(&req.keys)?
            }
            (true, _) => {
                // Refuse before hashing: a huge token list costs CPU and memory.
                let bs = if req.block_size == 0 {
                    engine.config().default_block_size
                } else {
                    req.block_size as usize
                };
                check_count(req.tokens.len() / bs.max(1))?;
                let hash = HashFn::parse(&req.hash).map_err(to_status)?;
                let keys = engine
                    .keys_for_tokens(&req.tokens, req.block_size as usize, hash)
                    .map_err(to_status)?;
                check_count(keys.len())?;
                keys
            }
        };
        let lease = (req.lease_ms > 0).then(|| Duration::from_millis(req.lease_ms as u64));
        let out = engine
            .lookup(&ns, &keys, lease, &mut clock.storage)
            .await
            .map_err(to_status)?;
        // The read that follows a lookup finds the store's blocks under way.
        engine.prefetch(&ns, &keys[..out.tiers.len()], &out.tiers);
        let (nodes, tier_counts) = crate::messages::placement(&out.places, &self.shared.node);
        Ok(pb::LookupResponse {
            nodes,
            tier_counts,
            found_blocks: out.found as u32,
            tiers: out.tiers.into_iter().map(tier).collect(),
            keys: if req.tokens.is_empty() {
                Vec::new()
            } else {
                keys.iter().map(Key::bytes).collect()
            },
            lease_id: out.lease.map_or(0, |l| l.id),
            lease_expires_unix_ms: out.lease.map_or(0, |l| l.expires_unix_ms),
            timing: Some(clock.finish()),
        })
    }

    async fn write_batch(
        &self,
        who: &Principal,
        req: pb::WriteRequest,
        clock: &mut Clock,
        acc: &mut pb::WriteResponse,
        replace: bool,
    ) -> Result<(), Status> {
        let ns = state::namespace(&req.namespace)?;
        self.shared.allow(who, ns.as_str(), true)?;
        let engine = &self.shared.engine;
        let max = engine.config().max_block_size.bytes();
        // Verify every block before storing any of them.
        let blocks: Vec<Block> = req
            .blocks
            .into_iter()
            .enumerate()
            .map(|(i, b)| block_from_pb(&ns, i, b, max))
            .collect::<Result<_, _>>()?;
        self.shared.note_tokens(&blocks);
        for b in blocks {
            let len = b.payload.len() as u64;
            // Only a node of the cluster forwarding an HTTP key/value put asks to replace.
            let before = clock.storage.deferred;
            let r = if replace {
                engine.put_value(b, &mut clock.storage).await
            } else {
                engine.write(b, &mut clock.storage).await
            };
            acc.deferred += clock.storage.deferred - before;
            match r.map_err(to_status)? {
                WriteOutcome::Stored => acc.stored += 1,
                WriteOutcome::Existing => acc.existing += 1,
            }
            self.shared.metrics.bytes_in.inc_by(len);
        }
        Ok(())
    }
}

/// A forwarded key/value put (`kvtier-forwarded: replace`).
fn forwarded_replace(md: &tonic::metadata::MetadataMap) -> bool {
    md.get(crate::cluster::FORWARDED)
        .is_some_and(|v| v.as_bytes() == b"replace")
}

type ReadStream = Pin<Box<dyn Stream<Item = Result<pb::ReadResponse, Status>> + Send>>;

#[tonic::async_trait]
impl KvTier for V1Service {
    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        let this = self.routed(request.metadata());
        let who = this.shared.caller(super::credential(request.metadata()))?;
        let arrived = state::arrival(request.extensions());
        let req = request.into_inner();
        this.serve("lookup", arrived, async |clock| {
            this.lookup_inner(&who, req, clock).await
        })
        .await
    }

    type ReadStream = ReadStream;

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<ReadStream>, Status> {
        let this = self.routed(request.metadata());
        let who = this.shared.caller(super::credential(request.metadata()))?;
        let arrived = state::arrival(request.extensions()).unwrap_or_else(Instant::now);
        let deadline = super::deadline(request.metadata(), arrived);
        let req = request.into_inner();
        let state::Admitted { mut outcome, hold } =
            this.shared.admit((API, "read"), Some(arrived)).await?;
        let (ns, keys) = match crate::read::prepare(&this.shared, &who, &req) {
            Ok(v) => v,
            Err(e) => {
                outcome.set(e.label());
                return Err(e.into());
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::ReadResponse, Status>>(2);
        let shared = this.shared.clone();
        tokio::spawn(kvtier_core::deadline::scope(deadline, async move {
            let mut reader = crate::read::PrefixReader::new(ns, keys, deadline);
            loop {
                match reader.next(&shared, &mut outcome.clock).await {
                    Ok(Some((i, b, t))) => {
                        let item = crate::read::read_block(i, &b, t, b.payload.clone());
                        let msg = pb::ReadResponse {
                            item: Some(pb::read_response::Item::Block(item)),
                        };
                        if tx.send(Ok(msg)).await.is_err() {
                            return; // the outcome stays `cancelled`
                        }
                        shared.metrics.bytes_out.inc_by(b.payload.len() as u64);
                    }
                    Ok(None) => break,
                    Err(refusal) => {
                        outcome.set(refusal.label());
                        let _ = tx.send(Err(refusal.into())).await;
                        return;
                    }
                }
            }
            let done = reader.outcome().done(&outcome.clock);
            outcome.set("ok");
            let item = Some(pb::read_response::Item::Done(done));
            let _ = tx.send(Ok(pb::ReadResponse { item })).await;
        }));
        // The admission is held by the stream, so given back once the last
        // message was encoded and sent: sending the payloads is most of a
        // read's cost, and the concurrency limit must see it.
        Ok(Response::new(Box::pin(state::Holding {
            inner: tokio_stream::wrappers::ReceiverStream::new(rx),
            _hold: hold,
        })))
    }

    async fn write(
        &self,
        request: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let this = self.routed(request.metadata());
        // Only a request served as forwarded (from a peer: [`Shared::route`]) may replace.
        let replace = matches!(this, Cow::Owned(_)) && forwarded_replace(request.metadata());
        let who = this.shared.caller(super::credential(request.metadata()))?;
        let arrived = state::arrival(request.extensions());
        let req = request.into_inner();
        this.serve("write", arrived, async |clock| {
            let mut resp = pb::WriteResponse::default();
            this.write_batch(&who, req, clock, &mut resp, replace)
                .await?;
            resp.timing = Some(clock.finish());
            Ok(resp)
        })
        .await
    }

    async fn write_stream(
        &self,
        request: Request<Streaming<pb::WriteRequest>>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let this = self.routed(request.metadata());
        // Only a request served as forwarded (from a peer: [`Shared::route`]) may replace.
        let replace = matches!(this, Cow::Owned(_)) && forwarded_replace(request.metadata());
        let who = this.shared.caller(super::credential(request.metadata()))?;
        let arrived = state::arrival(request.extensions());
        let mut stream = request.into_inner();
        this.serve("write_stream", arrived, async |clock| {
            let mut resp = pb::WriteResponse::default();
            while let Some(msg) = stream.next().await {
                this.write_batch(&who, msg?, clock, &mut resp, replace)
                    .await?;
            }
            resp.timing = Some(clock.finish());
            Ok(resp)
        })
        .await
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let this = self.routed(request.metadata());
        let who = this.shared.caller(super::credential(request.metadata()))?;
        let arrived = state::arrival(request.extensions());
        let req = request.into_inner();
        this.serve("delete", arrived, async |clock| {
            let ns = state::namespace(&req.namespace)?;
            this.shared.allow(&who, ns.as_str(), true)?;
            check_count(req.keys.len())?;
            let mut deleted = 0;
            for key in state::keys(&req.keys)? {
                let id = BlockId::new(ns.clone(), key);
                deleted += this
                    .shared
                    .engine
                    .delete(&id, &mut clock.storage)
                    .await
                    .map_err(to_status)?;
            }
            Ok(pb::DeleteResponse {
                deleted: deleted as u32,
                timing: Some(clock.finish()),
            })
        })
        .await
    }

    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let this = self.routed(request.metadata());
        let who = this.shared.caller(super::credential(request.metadata()))?;
        let arrived = state::arrival(request.extensions());
        let req = request.into_inner();
        this.serve("lease", arrived, async |clock| {
            let engine = &this.shared.engine;
            if req.release_lease_id != 0 {
                // Another tenant's lease answers exactly as one never
                // granted (NOT_FOUND, same words, no refusal counted in
                // /metrics): naming its namespace, or answering differently,
                // would let a tenant map others' namespaces and activity.
                engine
                    .release_lease_if(req.release_lease_id, |ns| {
                        ns.is_none_or(|ns| who.check(ns.as_str(), false).is_ok())
                    })
                    .map_err(to_status)?;
                return Ok(pb::LeaseResponse {
                    lease_id: req.release_lease_id,
                    lease_expires_unix_ms: 0,
                    timing: Some(clock.finish()),
                });
            }
            let ns = state::namespace(&req.namespace)?;
            this.shared.allow(&who, ns.as_str(), false)?;
            check_count(req.keys.len())?;
            let keys = state::keys(&req.keys)?;
            let g = engine
                .lease(&ns, &keys, Duration::from_millis(req.lease_ms as u64))
                .map_err(to_status)?;
            Ok(pb::LeaseResponse {
                lease_id: g.id,
                lease_expires_unix_ms: g.expires_unix_ms,
                timing: Some(clock.finish()),
            })
        })
        .await
    }

    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let this = self.routed(request.metadata());
        this.shared.caller(super::credential(request.metadata()))?;
        let arrived = state::arrival(request.extensions());
        this.serve("stats", arrived, async |clock| {
            let s = this.shared.engine.stats();
            let adv = &this.shared.advertise;
            Ok(pb::StatsResponse {
                tiers: s
                    .tiers
                    .iter()
                    .map(|(k, t)| pb::TierStats {
                        tier: tier(*k),
                        blocks: t.blocks,
                        bytes: t.bytes,
                        capacity_bytes: t.capacity_bytes,
                        hits: t.hits,
                        misses: t.misses,
                        evictions: t.evictions,
                    })
                    .collect(),
                active_leases: s.active_leases,
                expired_blocks: s.tiers.iter().map(|(_, t)| t.expirations).sum(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                data_listen: adv
                    .data_addr
                    .get()
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                local_listen: adv.same_host_path.get().cloned().unwrap_or_default(),
                max_message_size: adv.max_message_size,
                instance_id: adv.instance_id,
                cluster_self: this.shared.cluster_self.clone(),
                timing: Some(clock.finish()),
            })
        })
        .await
    }
}
