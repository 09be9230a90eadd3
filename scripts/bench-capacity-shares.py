#!/usr/bin/env python3
"""A quiet tenant's prefix hit rate next to a noisy one, with and without
capacity shares (docs/security.md, "Capacity shares"): notes/062-capacity-shares.

One release ``kvtier serve`` per variant and repeat, memory tier only
(256 MiB), 4 MiB blocks over gRPC from this process:

* the **victim** (namespace ``quiet/chat``) keeps 6 prompts of 4 blocks
  (96 MiB, under half the tier) and, every round, looks each prompt up
  (the blocks found are its hits) and writes it again, as an engine saves
  what it had to recompute;
* the **noisy neighbour** writes the tier's size (256 MiB) of new 4-block
  chains per round into its own namespaces (``noisy/0`` .. ``noisy/7``),
  4 rounds: four times the tier in all. A neighbour that writes more than
  the tier between two uses of the victim's prompts is what a tier-wide
  LRU cannot survive.

Variants, alternating (A B C, C B A, ...):

* ``alone``: the victim without the neighbour: the ceiling (every
  lookup after the first round hits), the floor the others are read against;
* ``lru``: ``[tenants] fair_shares = false``, one tier-wide LRU;
* ``shares``: the default, max-min fair eviction between tenants.

Each figure is a median over the repeats; every repeat is in the record, and
repeats outside 0.75-1.33x their median are listed (perf.ab).

    .venv/bin/python scripts/bench-capacity-shares.py [--out notes/062-capacity-shares.json] [--repeat 5]

Needs ``cargo build --release -p kvtier``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from _perf import ROOT

from kvtier import Client
from perf import alternate, header, summarize, versions, write_record
from perf.services import kvtier_server, release_binary

MIB = 1 << 20
BLOCK = 4 * MIB
TIER_MIB = 256
PROMPTS, PROMPT_BLOCKS = 6, 4
ROUNDS, NOISY_CHAINS = 4, 16  # 16 chains x 4 blocks x 4 MiB = 256 MiB per round
CONFIGS = {"alone": None, "lru": "[tenants]\nfair_shares = false\n", "shares": None}


def tokens(seed: int, blocks: int, block_size: int) -> list[int]:
    return [(seed << 20) + t for t in range(blocks * block_size)]


BINARY: str | None = None  # --kvtier: default the release binary


def run(variant: str, _repeat: int) -> dict[str, Any]:
    with kvtier_server(BINARY, args=["--memory-capacity", f"{TIER_MIB}MiB"], config=CONFIGS[variant]) as srv:
        c = Client(srv.grpc, data_plane=False, timeout=60.0)
        try:
            bs = c.block_size
            payloads = [bytes([i]) * BLOCK for i in range(PROMPT_BLOCKS)]
            prompts = [tokens(1 + p, PROMPT_BLOCKS, bs) for p in range(PROMPTS)]
            for t in prompts:
                c.write_tokens("quiet/chat", t, payloads)
            found = asked = 0
            noisy_bytes, noisy_s = 0, 0.0
            for r in range(ROUNDS):
                if variant != "alone":
                    t0 = time.perf_counter()
                    for i in range(NOISY_CHAINS):
                        seed = 1000 + r * NOISY_CHAINS + i
                        c.write_tokens(f"noisy/{i % 8}", tokens(seed, PROMPT_BLOCKS, bs), payloads)
                    noisy_s += time.perf_counter() - t0
                    noisy_bytes += NOISY_CHAINS * PROMPT_BLOCKS * BLOCK
                for t in prompts:
                    found += c.lookup("quiet/chat", tokens=t).found
                    asked += PROMPT_BLOCKS
                    c.write_tokens("quiet/chat", t, payloads)
        finally:
            c.close()
    hit = found / asked
    gbps = noisy_bytes / noisy_s / 1e9 if noisy_s else 0.0
    print(f"{variant}: victim hit rate {hit:.3f}, noisy writes {gbps:.2f} GB/s", flush=True)
    return {"hit_rate": hit, "noisy_write_gbps": gbps}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "notes/062-capacity-shares.json"))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--kvtier", help="the kvtier binary (default target/release/kvtier)")
    a = p.parse_args()
    global BINARY
    BINARY = a.kvtier
    samples = alternate(list(CONFIGS), a.repeat, run)
    results: dict[str, Any] = {}
    for v, rs in samples.items():
        results[v] = {
            "hit_rate": summarize([r["hit_rate"] for r in rs]).as_dict(),
            "noisy_write_gbps": summarize([r["noisy_write_gbps"] for r in rs]).as_dict(),
        }
    fields = {
        "what": "victim prefix hit rate (blocks found / asked) under a noisy neighbour writing 4x the tier",
        "memory_tier_mib": TIER_MIB,
        "block_bytes": BLOCK,
        "victim_blocks": PROMPTS * PROMPT_BLOCKS,
        "rounds": ROUNDS,
        "noisy_mib_per_round": NOISY_CHAINS * PROMPT_BLOCKS * BLOCK // MIB,
        "repeats": a.repeat,
        "results": results,
    }
    write_record(a.out, fields, header(versions=versions("kvtier", paths={"kvtier": a.kvtier or release_binary()})))
    print(json.dumps({v: {k: round(x["median"], 3) for k, x in r.items()} for v, r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
