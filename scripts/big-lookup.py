#!/usr/bin/env python3
"""What an oversized Lookup costs the server before it is refused
(notes/034): a kvtier.v1 Lookup of 10 M one-byte tokens (9 MiB encoded,
block_size 16: 625,000 blocks, over the 65,536-block limit) and a kvstore
Lookup of 10 M tokens, against a fresh `kvtier serve` per variant and
repeat, variants alternating. Measured: time until the error arrives, and
the server's RSS growth (sampled every 5 ms) while it is handled. Also one
Lookup at the token limit (8,388,608 tokens, block_size 128: 65,536 blocks)
to show that the limit itself is served.

  python3 scripts/big-lookup.py --base /tmp/base/kvtier-527f9cc --repeat 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import grpc
from _perf import ROOT

from kvtier._proto import load
from perf import Sampler, header, versions, write_record
from perf.services import kvtier_server


def one(binary: Path, pb, method: str, body: bytes) -> dict:
    server = kvtier_server(binary)
    try:
        ch = grpc.insecure_channel(server.grpc, options=[("grpc.max_send_message_length", 512 << 20),
                                                         ("grpc.max_receive_message_length", 512 << 20)])
        call = ch.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        time.sleep(0.2)
        with Sampler(server.pid, 0.005) as rss:
            t0 = time.perf_counter()
            try:
                call(body, timeout=60)
                outcome = "OK"
            except grpc.RpcError as e:
                outcome = f"{e.code().name}: {(e.details() or '')[:100]}"
            ms = (time.perf_counter() - t0) * 1000
        ch.close()
        return {"ms": round(ms, 1), "rss_growth_mib": round(rss.rss_peak - rss.rss_before, 1), "outcome": outcome}
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="kvtier binary from before the change")
    ap.add_argument("--kvtier", default=str(ROOT / "target/release/kvtier"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "notes/034-big-lookup.json"))
    a = ap.parse_args()
    head = header(versions=versions("kvtier", paths={"kvtier": a.kvtier}))
    pb = load()
    cases = {
        "v1 Lookup, 10 M tokens": ("/kvtier.v1.KvTier/Lookup",
                                   pb.v1.LookupRequest(namespace="n", tokens=[7] * 10_000_000,
                                                       block_size=16).SerializeToString()),
        "kvstore Lookup, 10 M tokens": ("/kvstore.KVStoreService/Lookup",
                                        pb.kvstore.LookupRequest(resource_name="r", container_name="c",
                                                                 tokens=[7] * 10_000_000).SerializeToString()),
        "v1 Lookup at the limit, 8,388,608 tokens": (
            "/kvtier.v1.KvTier/Lookup",
            pb.v1.LookupRequest(namespace="n", tokens=[7] * 8_388_608, block_size=128).SerializeToString()),
    }
    variants = {"before": Path(a.base), "after": Path(a.kvtier)}
    rows = []
    for rep in range(1, a.repeat + 1):
        for case, (method, body) in cases.items():
            for label, binary in variants.items():
                row = {"case": case, "variant": label, "repeat": rep, "encoded_mib": round(len(body) / 2**20, 1),
                       **one(binary, pb, method, body)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    summary = {
        case: {label: {"ms_median": statistics.median(r["ms"] for r in rows if r["case"] == case and r["variant"] == label),
                       "rss_growth_mib_median": statistics.median(
                           r["rss_growth_mib"] for r in rows if r["case"] == case and r["variant"] == label),
                       "outcomes": sorted({r["outcome"] for r in rows if r["case"] == case and r["variant"] == label})}
               for label in variants}
        for case in cases
    }
    write_record(a.out, {
        "title": "Oversized Lookups: cost to the server before refusal, before and after list limits were checked "
                 "before decoding",
        "binaries": {k: str(v) for k, v in variants.items()},
        "summary": summary,
        "rows": rows,
    }, head)


if __name__ == "__main__":
    main()
