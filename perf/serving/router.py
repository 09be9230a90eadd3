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

    python -m perf.serving.router --port P --mode round-robin http://127.0.0.1:A http://127.0.0.1:B
    python -m perf.serving.router --port P --mode pd --prefill http://... --decode http://...

``GET /stats`` answers how many requests went to each backend.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["make_app", "main"]

_SESSION = web.AppKey("session", aiohttp.ClientSession)

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], request: web.Request,
                  ) -> web.StreamResponse:
    async with session.post(url, json=body) as up:
        resp = web.StreamResponse(status=up.status,
                                  headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS})
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


def make_app(backends: list[str], mode: str, seed: int = 0, prefill: str = "", decode: str = "") -> web.Application:
    counts: dict[str, int] = {}
    cycle = itertools.cycle(backends) if backends else None
    rng = random.Random(seed)

    async def session_ctx(app: web.Application):
        # No total timeout: a request at saturation may queue for minutes;
        # the benchmark client has its own.
        app[_SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                               connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[_SESSION].close()

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
        backend = next(cycle) if mode == "round-robin" and cycle else rng.choice(backends)
        counts[backend] = counts.get(backend, 0) + 1
        return await _stream(session, backend + path, body, request)

    async def models(request: web.Request) -> web.Response:
        url = (prefill or backends[0]) + "/v1/models"
        async with request.app[_SESSION].get(url) as up:
            return web.Response(status=up.status, body=await up.read(), content_type="application/json")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"mode": mode, "requests": counts})

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
    ap.add_argument("--mode", choices=["round-robin", "random", "pd"], default="round-robin")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill", default="")
    ap.add_argument("--decode", default="")
    ap.add_argument("backends", nargs="*")
    a = ap.parse_args(argv)
    if a.mode == "pd" and not (a.prefill and a.decode):
        ap.error("--mode pd needs --prefill and --decode")
    if a.mode != "pd" and not a.backends:
        ap.error("give at least one backend URL")
    web.run_app(make_app(a.backends, a.mode, a.seed, a.prefill, a.decode), host=a.host, port=a.port,
                print=None, access_log=None)


if __name__ == "__main__":
    main()
