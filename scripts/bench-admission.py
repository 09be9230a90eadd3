#!/usr/bin/env python3
"""What each admission policy writes to the disk tier and the object store,
and what it keeps of the hit rate, on a replayed serving trace:
notes/064-admission.

A release ``kvtier serve`` with a memory tier smaller than the trace's
working set, a disk tier and a ``file://`` object store (write-back) is
driven the way vLLM's connector drives it, request by request in the
trace's arrival order: a Lookup of the prompt's full 64-token blocks, a
Read of the blocks found (what the engine loads), a Write of the rest
(what the engine computed and saves). Per policy (``disk.admission`` and
``object_store.admission`` set alike; each on a fresh server and fresh
directories), the record has the blocks and bytes written to each lower
tier (the server's ``kvtier_tier_written_bytes_total``), the object-store
PUTs (``kvtier_object_puts_total``), the blocks each tier was asked for,
and the hit rate: the prompt tokens served from kvtier over all prompt
tokens, against the trace's infinite-cache bound.

Two traces: ``chat``, notes/048's multi-turn trace (``perf/serving/trace.py``)
with more users; and ``chat+single``, the same with two single-use prompts
(random text, nothing shared) between every two chat requests, as a
deployment whose traffic is mostly one-off.

Tokens: the trace's words mapped to token ids by a hash (a word is 1–3
tokens by its length), not the test model's tokenizer: what admission sees
is which 64-token blocks repeat, which a word-level mapping keeps (each
prompt extends its conversation's previous one by whole words). The
payload per block is ``--block-bytes`` (default 1 MiB); an 8B model's
64-token block is 8 MiB (64 × 128 KiB), which the note's cost table scales
to.

    .venv/bin/python scripts/bench-admission.py [--out notes/064-admission.json]

Needs ``cargo build --release -p kvtier``.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _perf import ROOT

from kvtier import Block, Client, Tier
from kvtier.keys import chain
from perf import header, versions, write_record
from perf.services import kvtier_server, release_binary
from perf.serving.trace import TraceSpec, generate, infinite_cache_hits

#: (name, disk.admission, object_store.admission)
POLICIES = (("all", "all", "all"), ("reuse", "reuse", "reuse"), ("tinylfu", "tinylfu", "tinylfu"),
            ("disk-all+object-reuse", "all", "reuse"))
#: AWS S3 Standard, us-east-1, list prices as published in 2025 (not
#: re-checked from this machine, which has no web access): USD.
S3_PRICE_DATE = "2025 list prices (not re-checked)"
S3_PRICES = {"put_per_1000": 0.005, "gb_month": 0.023}
#: What the cost table scales to: an 8B model's 64-token block (64 x 128 KiB),
#: 10 requests a second for 30 days, each object kept 30 days.
SCALE = {"block_bytes": 8 << 20, "requests_per_s": 10, "days": 30}
BLOCK_TOKENS = 64
NS = "admission"


def tokens(text: str) -> list[int]:
    """Word-level stand-in tokenizer: 1–3 ids per word, by a hash of it."""
    out: list[int] = []
    for w in text.split(" "):
        h = hashlib.blake2b(w.encode(), digest_size=8).digest()
        n = 1 + len(w) // 4
        out.extend(int.from_bytes(h[2 * i:2 * i + 2], "little") for i in range(min(n, 3)))
    return out


def traces(users: int, turns: int, seed: int) -> dict[str, list[list[int]]]:
    chat = [tokens(t.prompt) for t in generate(TraceSpec(users=users, turns=turns, seed=seed))]
    rng = random.Random(seed + 1)

    def single() -> list[int]:
        return [rng.randrange(1 << 16) for _ in range(rng.randint(600, 2400))]

    mixed: list[list[int]] = []
    for p in chat:
        mixed += [single(), single(), p]
    return {"chat": chat, "chat+single": mixed}


def metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def replay(binary: Path, prompts: list[list[int]], disk: str, obj: str, memory: int,
           block_bytes: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kvtier-admission-"))
    (work / "store").mkdir()
    args = ["--memory-capacity", f"{memory}B", "--max-block-size", f"{block_bytes}B",
            "--disk-dir", str(work / "disk"), "--disk-capacity", "64GiB",
            "--object-store", f"file://{work / 'store'}",
            "--disk-admission", disk, "--object-admission", obj]
    payload = bytes(block_bytes)
    served = total = 0
    by_tier = {t.name.lower(): 0 for t in Tier}
    with kvtier_server(binary, args=args) as srv, Client(srv.grpc, connections=2, timeout=120.0) as c:
        for toks in prompts:
            keys = chain(toks, BLOCK_TOKENS)
            total += len(toks)
            found = c.lookup(NS, keys).found if keys else 0
            if found:
                r = c.read(NS, keys[:found])
                found = len(r.blocks)  # a block evicted between lookup and read is recomputed
                for b in r.blocks:
                    by_tier[Tier(b.tier).name.lower()] += 1
            # The engine computes the rest (and always the last token) and saves its full blocks.
            served += min(found * BLOCK_TOKENS, max(0, len(toks) - 1))
            todo = [Block(k, payload, parent=keys[i - 1] if i else None, token_count=BLOCK_TOKENS)
                    for i, k in enumerate(keys) if i >= found]
            for at in range(0, len(todo), 16):
                c.write(NS, todo[at:at + 16])
        # Uploads are written back: wait for the queue to drain before counting.
        end = time.monotonic() + 120
        while metric(_http(srv), "kvtier_object_writeback_queue_depth") > 0 and time.monotonic() < end:
            time.sleep(0.2)
        time.sleep(0.5)  # uploads admitted by the last reads are queued from tasks of their own
        m = _http(srv)
    out: dict[str, Any] = {
        "requests": len(prompts),
        "prompt_tokens": total,
        "served_tokens": served,
        "hit_rate": round(served / total, 4) if total else 0.0,
        "blocks_read_from": by_tier,
    }
    for tier in ("disk", "object"):
        out[tier] = {
            "written_bytes": int(metric(m, f'kvtier_tier_written_bytes_total{{tier="{tier}"}}')),
            **{o: int(metric(m, f'kvtier_tier_admission_blocks_total{{tier="{tier}",outcome="{o}"}}'))
               for o in ("admitted", "deferred", "rejected")},
        }
    out["object"]["puts"] = int(metric(m, "kvtier_object_puts_total"))
    out["memory_evictions"] = int(metric(m, 'kvtier_tier_evictions_total{tier="memory"}'))
    out["monthly_cost_usd"] = cost(out["object"]["puts"], out["object"]["written_bytes"] // block_bytes, len(prompts))
    return out


def cost(puts: int, blocks: int, requests: int) -> dict[str, float]:
    """The object store's bill for a month at :data:`SCALE`, from this replay's per-request rates."""
    n = SCALE["requests_per_s"] * 86400 * SCALE["days"]
    gb = blocks / requests * n * SCALE["block_bytes"] / 1e9
    out = {"puts": puts / requests * n / 1000 * S3_PRICES["put_per_1000"],
           "storage": gb * S3_PRICES["gb_month"] * SCALE["days"] / 30}
    return {k: round(v, 2) for k, v in {**out, "total": sum(out.values())}.items()}


def _http(srv: Any) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{srv.http}/metrics", timeout=30) as r:
        return r.read().decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "notes" / "064-admission.json"))
    ap.add_argument("--users", type=int, default=15)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-bytes", type=int, default=1 << 20)
    ap.add_argument("--memory-blocks", type=int, default=128,
                    help="memory tier, in blocks (the chat trace's working set is a few hundred)")
    ap.add_argument("--kvtier", default=None, help="the server binary (default: target/release/kvtier)")
    a = ap.parse_args()
    binary = Path(a.kvtier) if a.kvtier else release_binary()
    memory = a.memory_blocks * (a.block_bytes + 4096)
    results: dict[str, Any] = {}
    sizes: dict[str, Any] = {}
    for name, prompts in traces(a.users, a.turns, a.seed).items():
        bound = infinite_cache_hits(prompts, BLOCK_TOKENS)
        distinct = len({k for p in prompts for k in chain(p, BLOCK_TOKENS)})
        sizes[name] = {"requests": len(prompts), "prompt_tokens": sum(map(len, prompts)),
                       "distinct_blocks": distinct,
                       "infinite_cache_hit_rate": round(sum(bound) / sum(map(len, prompts)), 4)}
        results[name] = {}
        for policy, disk, obj in POLICIES:
            r = replay(binary, prompts, disk, obj, memory, a.block_bytes)
            results[name][policy] = {"disk_admission": disk, "object_admission": obj, **r}
            print(f"{name} {policy}: hit {r['hit_rate']:.3f} disk {r['disk']['written_bytes'] >> 20} MiB "
                  f"object {r['object']['written_bytes'] >> 20} MiB, {r['object']['puts']} PUTs", flush=True)
    fields = {
        "what": "bytes and PUTs each admission policy writes to the disk tier and the object store, and the hit "
                "rate it keeps, replaying notes/048's chat trace (and one with single-use prompts) as vLLM's "
                "connector drives kvtier",
        "block_tokens": BLOCK_TOKENS,
        "block_bytes": a.block_bytes,
        "memory_bytes": memory,
        "tokenizer": "word-level stand-in: 1-3 ids per word by blake2b (see the script)",
        "traces": sizes,
        "trace_spec": {"users": a.users, "turns": a.turns, "seed": a.seed},
        "prices": {"store": "AWS S3 Standard, us-east-1", "date": S3_PRICE_DATE, **S3_PRICES},
        "cost_scale": SCALE,
        "results": results,
    }
    write_record(a.out, fields, header(versions=versions("kvtier", paths={"kvtier": binary})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
