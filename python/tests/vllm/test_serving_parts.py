"""The serving benchmark's parts without engines: the trace and its
infinite-cache bound, the report's verdicts, and the router's two modes
against stand-in backends (docs/serving.md)."""
from __future__ import annotations

import asyncio
import sys

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvtier.server import REPO_ROOT

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from perf.serving import report
from perf.serving.router import make_app
from perf.serving.trace import TraceSpec, generate, infinite_cache_hits


def test_trace_is_seeded_and_each_turn_extends_the_last():
    spec = TraceSpec(users=3, turns=3, system_words=20, user_words=5, reply_words=4, seed=7)
    a, b = generate(spec), generate(spec)
    assert a == b
    assert generate(TraceSpec(users=3, turns=3, system_words=20, user_words=5, reply_words=4, seed=8)) != a
    assert [(t.turn, t.user) for t in a] == [(t, u) for t in range(3) for u in range(3)], "turn by turn"
    by_user = {u: [t.prompt for t in a if t.user == u] for u in range(3)}
    system = a[0].prompt.split(" ")[:20]
    for prompts in by_user.values():
        assert prompts[0].split(" ")[:20] == system, "every conversation starts with the shared system prompt"
        for prev, nxt in zip(prompts, prompts[1:]):
            assert nxt.startswith(prev + " ") and len(nxt.split(" ")) == len(prev.split(" ")) + 4 + 5


def test_infinite_cache_bound_counts_leading_blocks_seen_before():
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    prompts = [a + b + [9], a + b + [9, 10, 11, 12, 13], [5, 6, 7, 8, 1, 2], a + [0, 0, 0, 0, 1]]
    # 1st: nothing seen; 2nd: blocks a, b (8 tokens); 3rd: starts with b, but
    # only leading blocks count: 0; 4th: a (4), then a new block.
    assert infinite_cache_hits(prompts, 4) == [0, 8, 0, 4]
    # the last token is always computed: an identical 8-token prompt hits 4, not 8
    assert infinite_cache_hits([a + b, a + b], 4) == [0, 4]


def _step(rate, p50, p99, hit=0.5, failed=0):
    return {"request_rate": rate, "median_ttft_ms": p50, "p90_ttft_ms": p99, "p99_ttft_ms": p99, "failed": failed,
            "hit_rate": hit, "local_hit_rate": 0.3, "external_hit_rate": hit - 0.3, "median_itl_ms": 5.0,
            "request_throughput": rate, "output_throughput": 16 * rate, "trace": 0}


def test_report_verdicts():
    rec = {
        "rates": [0.5, 1, 2],
        "traces": [{"infinite_cache_hit_rate": 0.8}],
        "runs": [
            {"topology": "two", "system": "alone", "steps": [_step(0.5, 100, 300, 0.4), _step(1, 400, 900, 0.4),
                                                               _step(2, 3000, 9000, 0.4)]},
            {"topology": "two", "system": "kvtier", "steps": [_step(0.5, 20, 50, 0.78), _step(1, 25, 200, 0.75),
                                                                _step(2, 60, 400, 0.7)]},
            {"topology": "two", "system": "broken", "error": "PeerUnavailable: no", "steps": []},
        ],
    }
    s = report.summary(rec)
    assert s["idle_ttft_ms"]["two"]["ms"] == 100 and s["ttft_bound_ms"]["two"] == 1000
    assert s["sustained_rate"] == {"two/alone": 1, "two/kvtier": 2}
    t = s["targets"]
    assert t["rate_compared"] == 1 and t["ttft_p50_ratio"] == 25 / 400 and t["ttft_p99_ratio"] == 200 / 900
    assert t["ttft_p50_met"] and t["ttft_p99_met"] and t["sustained_ratio"] == 2 and t["sustained_ratio_met"]
    assert t["sustained_kvtier_is_sweep_top"]
    assert abs(t["hit_vs_bound_min"] - 0.7 / 0.8) < 1e-12 and not t["hit_vs_bound_met"]
    rec["runs"][0]["outputs"] = [{"text": "x", "top_logprobs": [{"a": -0.1, "b": -2.0}]}] * 2
    rec["runs"][1]["outputs"] = [{"text": "x", "top_logprobs": [{"a": -0.1, "b": -2.0}]},
                                 {"text": "y", "top_logprobs": [{"a": -3.0, "b": -0.5}]}]
    o = report.outputs(rec)["two/kvtier"]
    assert o == {"against": "two/alone", "checked": 2, "same_first_token": 1, "max_logprob_diff": 2.9}
    text = report.tables({**rec, "summary": s})
    assert "| broken | `PeerUnavailable: no` |" in text


def test_router_round_robin_and_prefill_decode():
    async def go():
        seen: dict[str, list] = {"a": [], "b": []}

        def backend(name):
            async def completions(request):
                body = await request.json()
                seen[name].append(body)
                if body.get("stream"):
                    resp = web.StreamResponse()
                    await resp.prepare(request)
                    await resp.write(f"data: {name}\n\n".encode())
                    await resp.write_eof()
                    return resp
                return web.json_response({"choices": [{"text": name}], "kv_transfer_params": {"kvtier_blocks": 3}})
            app = web.Application()
            app.router.add_post("/v1/completions", completions)
            return app

        servers = [TestServer(backend("a")), TestServer(backend("b"))]
        for s in servers:
            await s.start_server()
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        rr = TestClient(TestServer(make_app(urls, "round-robin")))
        await rr.start_server()
        got = []
        for i in range(4):
            r = await rr.post("/v1/completions", json={"prompt": f"p{i}", "stream": True})
            got.append((await r.read()).decode())
        assert got == ["data: a\n\n", "data: b\n\n", "data: a\n\n", "data: b\n\n"]
        assert (await (await rr.get("/stats")).json())["requests"] == {urls[0]: 2, urls[1]: 2}
        bad = await rr.post("/v1/completions", data=b"{not json")
        assert bad.status == 400 and "not JSON" in (await bad.json())["error"]
        await rr.close()

        seen["a"].clear()
        seen["b"].clear()
        pd = TestClient(TestServer(make_app([], "pd", prefill=urls[0], decode=urls[1])))
        await pd.start_server()
        r = await pd.post("/v1/completions", json={"prompt": "q", "max_tokens": 9, "stream": True,
                                                    "stream_options": {"include_usage": True}})
        assert (await r.read()).decode() == "data: b\n\n"
        [first] = seen["a"]
        assert first["max_tokens"] == 1 and first["stream"] is False and "stream_options" not in first
        assert first["kv_transfer_params"] == {"do_remote_decode": True}
        [second] = seen["b"]
        assert second["max_tokens"] == 9 and second["kv_transfer_params"] == {"kvtier_blocks": 3}
        await pd.close()
        for s in servers:
            await s.close()

    asyncio.run(go())


def test_report_puts_a_second_run_beside_the_first():
    first = {"runs": [{"topology": "two", "system": "kvtier", "steps": [_step(1, 80, 160, 0.74)]},
                      {"topology": "two", "system": "peer", "steps": [_step(1, 90, 120, 0.74)]}]}
    again = {"runs": [{"topology": "two", "system": "peer", "steps": [_step(1, 100, 140, 0.74), _step(2, 1, 1)]},
                      {"topology": "two", "system": "kvtier", "steps": [_step(1, 70, 100, 0.74)]},
                      {"topology": "two", "system": "gone", "error": "x", "steps": []}]}
    rows = {r["system"]: r for r in report.repeats(first, again)}
    assert set(rows) == {"kvtier", "peer"}, "rates and systems only the second run has are left out"
    assert rows["kvtier"]["p99_ms"] == [160, 100] and rows["kvtier"]["p99_mean_ms"] == 130
    assert rows["peer"]["p50_mean_ms"] == 95 and rows["peer"]["p99_mean_ms"] == 130
