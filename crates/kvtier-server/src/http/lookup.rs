//! `POST /v1/lookup`: the per-tier lookup over HTTP, for routers that do not
//! speak gRPC (docs/events.md, "Per-tier lookup"). The same engine call as
//! gRPC `Lookup`, without leases (a router asks, it does not read).
//!
//! Body: `{"namespace": "...", "tokens": [..], "block_size": N, "hash": "..."}`
//! or `{"namespace": "...", "keys": ["hex", ..]}`. Answer: `found_blocks`,
//! `tiers`, `nodes` and `tier_counts` (node, tier, blocks, leading).
use super::{core_error, error, handle, refused};
use crate::state::Shared;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kvtier_core::{HashFn, Key, Namespace};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LookupBody {
    namespace: String,
    #[serde(default)]
    tokens: Vec<u32>,
    #[serde(default)]
    keys: Vec<String>,
    #[serde(default)]
    block_size: usize,
    #[serde(default)]
    hash: String,
}

pub(super) async fn lookup(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Result<Json<LookupBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    handle(&s, "lookup", async |clock| {
        let Json(b) = body.map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                format!("lookup body: {e}"),
            )
        })?;
        let ns = Namespace::new(&b.namespace).map_err(core_error)?;
        if s.auth.enabled() {
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            s.auth
                .identify(bearer)
                .and_then(|who| who.check(ns.as_str(), false))
                .map_err(|d| {
                    s.metrics.observe_denied(&d);
                    refused(d.into())
                })?;
        }
        let bad = |m: String| error(StatusCode::BAD_REQUEST, "invalid_argument", m);
        let keys: Vec<Key> = match (b.keys.is_empty(), b.tokens.is_empty()) {
            (false, false) => return Err(bad("give either keys or tokens, not both".into())),
            (false, true) => b
                .keys
                .iter()
                .map(|k| {
                    let raw = hex::decode(k).map_err(|e| bad(format!("key {k:?}: {e}")))?;
                    Key::new(raw).map_err(core_error)
                })
                .collect::<Result<_, _>>()?,
            (true, _) => {
                // Refused before hashing, as gRPC Lookup does: a huge token
                // list costs CPU and memory.
                let bs = match b.block_size {
                    0 => s.engine.config().default_block_size,
                    n => n,
                };
                crate::messages::check_count(b.tokens.len() / bs.max(1)).map_err(refused)?;
                let hash = HashFn::parse(&b.hash).map_err(core_error)?;
                s.engine
                    .keys_for_tokens(&b.tokens, b.block_size, hash)
                    .map_err(core_error)?
            }
        };
        crate::messages::check_count(keys.len()).map_err(refused)?;
        let out = s
            .engine
            .lookup(&ns, &keys, None, &mut clock.storage)
            .await
            .map_err(core_error)?;
        let (nodes, counts) = crate::messages::placement(&out.places, &s.node);
        let tier = |t: i32| {
            kvtier_proto::v1::Tier::try_from(t)
                .map_or("unspecified", |t| t.as_str_name())
                .trim_start_matches("TIER_")
                .to_ascii_lowercase()
        };
        Ok(Json(serde_json::json!({
            "found_blocks": out.found,
            "tiers": out.tiers.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "nodes": nodes,
            "tier_counts": counts.iter().map(|c| serde_json::json!({
                "node": c.node,
                "tier": tier(c.tier),
                "blocks": c.blocks,
                "leading": c.leading,
            })).collect::<Vec<_>>(),
        }))
        .into_response())
    })
    .await
}
