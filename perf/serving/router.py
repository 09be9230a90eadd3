"""The router in front of vLLM replicas: what a load balancer does in a
serving deployment, small enough to read in one sitting.

``--mode round-robin`` (or ``random``, seeded) forwards each
``/v1/completions`` request to the next replica and streams its answer back
unchanged. ``--mode pd`` is vLLM's disaggregated-serving proxy pattern
(vLLM's ``disagg_proxy`` examples): the request first goes to the prefill
engine (``kv_role: kv_producer``) with ``max_tokens: 1`` and
``kv_transfer_params: {"do_remote_decode": true}``; the
``kv_transfer_params`` its answer carries are then added to the original
request, which goes to the decode engine (``kv_consumer``), whose stream is
the client's answer. With kvtier the parameters say how many blocks the
producer stored, and the consumer waits for them (docs/vllm.md,
"Prefill/decode split").

``--mode cache-aware`` sends each request where most of its prefix is
cached and the least work waits (docs/serving.md, "Cache-aware routing"):
it learns what each engine's prefix cache holds from vLLM's KV events
(``--engine-events``, one per backend, in order) and, optionally, what
each kvtier node holds from kvtier's (``--kvtier-events``, one per node;
replica i reads through the node of the i-th endpoint unless
``--replica-node`` names it; an endpoint may add its publisher's replay
endpoint after a comma, so missed messages are fetched: :mod:`.router_events`),
tokenizes the prompt (``--tokenizer`` the
model directory, else the first backend's ``/tokenize``) and scores the
replicas (:mod:`.router_score`, whose docstring has the weights; change
one with ``--weight NAME=VALUE``).

    python -m perf.serving.router --port P --mode round-robin http://127.0.0.1:A http://127.0.0.1:B
    python -m perf.serving.router --port P --mode pd --prefill http://... --decode http://...
    python -m perf.serving.router --port P --mode cache-aware --tokenizer MODEL \\
        --engine-events ipc:///run/e0 --engine-events ipc:///run/e1 \\
        --kvtier-events tcp://127.0.0.1:5601,tcp://127.0.0.1:5611 \\
        --kvtier-events tcp://127.0.0.1:5602,tcp://127.0.0.1:5612 http://...:A http://...:B

``GET /stats`` answers how many requests went to each backend (and, in
cache-aware mode, the tokens it credited per tier, the index and the feeds).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from .router_events import Feed, decoder, kvtier_keys
from .router_index import PrefixIndex
from .router_score import Load, Scorer, describe, parse_weights

__all__ = ["CacheAware", "make_app", "main"]

_SESSION = web.AppKey("session", aiohttp.ClientSession)

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], request: web.Request,
                  first: Callable[[], None] | None = None) -> web.StreamResponse:
    async with session.post(url, json=body) as up:
        resp = web.StreamResponse(status=up.status,
                                  headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS})
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            if first is not None:
                first()
                first = None
            await resp.write(chunk)
        await resp.write_eof()
        return resp


class CacheAware:
    """The cache-aware mode's state: the prefix index and its feeds, the
    load the router itself put on each replica, and the tokenizer."""

    def __init__(self, backends: Sequence[str], engine_events: Sequence[str], kvtier_events: Sequence[str] = (),
                 replica_nodes: Sequence[str] = (), tokenizer: str = "", weights: Sequence[str] = (),
                 namespace: str = "", event_types: str = "auto", kvtier_block_size: int = 0):
        self.backends = list(backends)
        self.index = PrefixIndex()
        decode, self.decoder = decoder(event_types)
        engines = [f"engine:{b}" if i < len(engine_events) and engine_events[i] else None
                   for i, b in enumerate(backends)]
        self.feeds = [Feed(ep, self.index, decode, engine=engines[i]) for i, ep in enumerate(engine_events) if ep]
        self.kv_feeds = [Feed(ep, self.index, decode, namespace=namespace) for ep in kvtier_events]
        self.replica_nodes = list(replica_nodes)
        self.kvtier_block_size = kvtier_block_size
        keys = kvtier_keys(lambda: sorted({ns for f in self.kv_feeds for ns in f.namespaces}), self._kv_block_size)
        self.scorer = Scorer(self.index, engines, weights=parse_weights(weights), use_kvtier=bool(kvtier_events),
                             kvtier_keys=keys)
        self.load = Load.empty(len(backends))
        self.credited: dict[str, float] = {}
        self.routed = self.fallback = 0
        self.tokenize_s = 0.0
        self.last_scores: list[dict[str, Any]] = []
        self._tok: Any = None
        if tokenizer:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(tokenizer)

    def _kv_block_size(self) -> int:
        """The connector's block size: as given, else the engines' (it writes engine blocks)."""
        if self.kvtier_block_size:
            return self.kvtier_block_size
        sizes = [b for s in self.index.sources.values() if s.kind == "engine" for b in s.block_sizes]
        return max(sizes) if sizes else 0

    def nodes(self) -> list[str | None]:
        """Each replica's own kvtier node: as given, else the one node the
        replica's kvtier endpoint (same position) publishes as."""
        if self.replica_nodes:
            return [n or None for n in self.replica_nodes]
        out: list[str | None] = []
        for i in range(len(self.backends)):
            names = self.kv_feeds[i].nodes if i < len(self.kv_feeds) else set()
            out.append(next(iter(names)) if len(names) == 1 else None)
        return out

    async def tokens(self, body: dict[str, Any], session: aiohttp.ClientSession) -> list[int] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return prompt
        if not isinstance(prompt, str):
            return None  # a batch of prompts: no single prefix to route by
        t0 = time.perf_counter()
        try:
            if self._tok is not None:
                tok = self._tok
                return list(await asyncio.to_thread(lambda: tok(prompt).input_ids))
            async with session.post(self.backends[0] + "/tokenize",
                                    json={"model": body.get("model"), "prompt": prompt}) as r:
                return list((await r.json())["tokens"]) if r.status == 200 else None
        finally:
            self.tokenize_s += time.perf_counter() - t0

    def route(self, tokens: list[int] | None) -> tuple[int, float]:
        """(replica, the prefill it is expected to compute)."""
        self.routed += 1
        if tokens is None:
            self.fallback += 1
            r = (self.scorer.last + 1) % len(self.backends)
            self.scorer.last = r
            return r, 0.0
        self.scorer.nodes = self.nodes()
        r, scores = self.scorer.choose(tokens, self.load)
        for tier, n in scores[r].tiers.items():
            self.credited[tier] = self.credited.get(tier, 0) + n
        self.credited["prompt"] = self.credited.get("prompt", 0) + len(tokens)
        self.last_scores = describe(scores)
        return r, max(0.0, len(tokens) - scores[r].credit)

    async def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(f.run()) for f in [*self.feeds, *self.kv_feeds]]

    def stats(self) -> dict[str, Any]:
        return {"decoder": self.decoder, "routed": self.routed, "untokenized": self.fallback,
                "credited_tokens": self.credited, "tokenize_s": self.tokenize_s, "nodes": self.nodes(),
                "weights": self.scorer.w, "index": self.index.stats(),
                "feeds": [f.stats() for f in [*self.feeds, *self.kv_feeds]],
                "load": {"inflight": self.load.inflight, "pending_prefill": self.load.pending_prefill,
                         "active": self.load.active}}


def make_app(backends: list[str], mode: str, seed: int = 0, prefill: str = "", decode: str = "",
             cache: CacheAware | None = None, log_decisions: bool = False) -> web.Application:
    """``log_decisions``: one JSON line per cache-aware request on stdout (the
    load and scores it was routed on, the time to its first byte)."""
    counts: dict[str, int] = {}
    cycle = itertools.cycle(backends) if backends else None
    rng = random.Random(seed)
    if mode == "cache-aware" and cache is None:
        raise ValueError("cache-aware mode needs its CacheAware state")

    async def session_ctx(app: web.Application):
        # No total timeout: a request at saturation may queue for minutes;
        # the benchmark client has its own.
        app[_SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                               connector=aiohttp.TCPConnector(limit=0))
        tasks = await cache.start() if cache is not None else []
        yield
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await app[_SESSION].close()

    async def cache_aware(body: dict[str, Any], request: web.Request) -> web.StreamResponse:
        assert cache is not None
        session = request.app[_SESSION]
        t0 = time.monotonic()
        tokens = await cache.tokens(body, session)
        load = cache.load
        seen = {"inflight": list(load.inflight), "pending_prefill": list(load.pending_prefill),
                "active": list(load.active)}
        r, prefill_tokens = cache.route(tokens)
        backend = backends[r]
        counts[backend] = counts.get(backend, 0) + 1
        context = len(tokens or ()) + int(body.get("max_tokens") or 0)
        load.inflight[r] += 1
        load.active[r] += context
        load.pending_prefill[r] += prefill_tokens
        pending = [prefill_tokens]
        decision = {"t": round(t0, 3), "replica": r, "tokens": len(tokens or ()), "load": seen,
                    "scores": cache.last_scores if tokens is not None else None}

        def first() -> None:  # the first token is out: its prefill no longer waits
            if pending[0] >= 0:
                decision["first_byte_ms"] = round((time.monotonic() - t0) * 1000, 1)
            load.pending_prefill[r] -= max(pending[0], 0.0)
            pending[0] = -1.0
        try:
            return await _stream(session, backend + request.path, body, request, first)
        finally:
            first()
            load.inflight[r] -= 1
            load.active[r] -= context
            if log_decisions:
                print(json.dumps(decision), flush=True)

    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"request body is not JSON: {e}"}, status=400)
        session = request.app[_SESSION]
        path = request.path
        if mode == "pd":
            first = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
            first.pop("stream_options", None)
            counts[prefill] = counts.get(prefill, 0) + 1
            async with session.post(prefill + path, json=first) as up:
                if up.status != 200:
                    return web.Response(status=up.status, body=await up.read(), content_type="application/json")
                params = (await up.json()).get("kv_transfer_params")
            counts[decode] = counts.get(decode, 0) + 1
            return await _stream(session, decode + path, {**body, "kv_transfer_params": params}, request)
        if mode == "cache-aware":
            return await cache_aware(body, request)
        backend = next(cycle) if mode == "round-robin" and cycle else rng.choice(backends)
        counts[backend] = counts.get(backend, 0) + 1
        return await _stream(session, backend + path, body, request)

    async def models(request: web.Request) -> web.Response:
        url = (prefill or backends[0]) + "/v1/models"
        async with request.app[_SESSION].get(url) as up:
            return web.Response(status=up.status, body=await up.read(), content_type="application/json")

    async def stats(request: web.Request) -> web.Response:
        out: dict[str, Any] = {"mode": mode, "requests": counts}
        if cache is not None:
            out["cache_aware"] = cache.stats()
        return web.json_response(out)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 << 20)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--mode", choices=["round-robin", "random", "pd", "cache-aware"], default="round-robin")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill", default="")
    ap.add_argument("--decode", default="")
    ap.add_argument("--engine-events", action="append", default=[],
                    help="cache-aware: a backend's vLLM KV-event endpoint, once per backend in order ('' for none); "
                         "ENDPOINT,REPLAY also names its replay_endpoint")
    ap.add_argument("--kvtier-events", action="append", default=[],
                    help="cache-aware: a kvtier node's --kv-events endpoint, once per node; "
                         "ENDPOINT,REPLAY also names its --kv-events-replay")
    ap.add_argument("--replica-node", action="append", default=[],
                    help="cache-aware: the kvtier node (host:port, as in its topics) each backend reads through, "
                         "in backend order; default: the node of the --kvtier-events endpoint at the same position")
    ap.add_argument("--kvtier-namespace", default="",
                    help="cache-aware: keep the kvtier namespaces starting with this (default: every namespace)")
    ap.add_argument("--kvtier-block-size", type=int, default=0,
                    help="cache-aware: tokens per kvtier block, to compute kvtier's keys for blocks it announced "
                         "without tokens (default: the engines' block size, from their events)")
    ap.add_argument("--tokenizer", default="", help="cache-aware: the model directory (else the backend's /tokenize)")
    ap.add_argument("--weight", action="append", default=[], help="cache-aware: NAME=VALUE (perf.serving.router_score)")
    ap.add_argument("--event-types", choices=["auto", "vllm", "plain"], default="auto",
                    help="decode events with vLLM's msgspec types (auto: when vLLM is importable) or untyped")
    ap.add_argument("--log-decisions", action="store_true",
                    help="cache-aware: one JSON line per request on stdout (load, scores, time to first byte)")
    ap.add_argument("backends", nargs="*")
    a = ap.parse_args(argv)
    if a.mode == "pd" and not (a.prefill and a.decode):
        ap.error("--mode pd needs --prefill and --decode")
    if a.mode != "pd" and not a.backends:
        ap.error("give at least one backend URL")
    cache = None
    if a.mode == "cache-aware":
        if not any(a.engine_events) and not a.kvtier_events:
            ap.error("--mode cache-aware needs --engine-events or --kvtier-events")
        if len(a.engine_events) > len(a.backends) or len(a.replica_node) not in (0, len(a.backends)):
            ap.error("--engine-events and --replica-node: at most / exactly one per backend")
        try:
            parse_weights(a.weight)
        except ValueError as e:
            ap.error(str(e))
        cache = CacheAware(a.backends, a.engine_events, a.kvtier_events, a.replica_node, a.tokenizer, a.weight,
                           a.kvtier_namespace, a.event_types, a.kvtier_block_size)
    web.run_app(make_app(a.backends, a.mode, a.seed, a.prefill, a.decode, cache, a.log_decisions), host=a.host,
                port=a.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
