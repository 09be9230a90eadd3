#!/usr/bin/env python3
"""Compression ratio and encode/decode throughput of the object-tier codecs
(docs/object-store.md#compression) on KV-like bf16 blocks, on one core and on
all cores: notes/063-codecs.

Runs the Rust bench ``crates/kvtier-object/examples/codec_bench.rs`` (release
by default) over ``--blocks`` blocks of ``--block-mib`` MiB (128 × 4 MiB, as
a 16k-token prefix) and writes its JSON under the common record header. The
shipped codecs (``zstd-planes``, ``lz4-planes``, ``fp8-e4m3``) run through
their real frame (checksums included); the other rows are the variants they
were chosen against (zstd without the plane split, zstd level 3, LZ4 without
planes, FP8 with 4096 values per scale).

Data: without ``--data``, synthetic bf16 from ``kv_like_bf16`` (per-channel
log-normal scales, 2 % outlier channels, 1e-4 spikes; see
``crates/kvtier-object/src/codec/synth.rs``). ``--data FILE`` takes raw
little-endian bf16 values instead (e.g. KV dumped from a trained model).

    python3 scripts/bench-codecs.py [--out notes/063-codecs.json] [--blocks 128] [--block-mib 4]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _perf import ROOT

from perf import header, versions, write_record


def bench_command(a: argparse.Namespace) -> list[str]:
    """The cargo command that builds and runs the bench."""
    cmd = ["cargo", "run", "--quiet", "-p", "kvtier-object", "--example", "codec_bench"]
    if not a.debug:
        cmd.insert(3, "--release")
    cmd += ["--", "--blocks", str(a.blocks), "--block-mib", str(a.block_mib), "--seed", str(a.seed)]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if a.data:
        cmd += ["--data", a.data]
    return cmd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "notes" / "063-codecs.json"))
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--block-mib", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=0, help="threads of the all-cores runs (default: every core)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=None, help="raw little-endian bf16 values instead of synthetic ones")
    ap.add_argument("--debug", action="store_true", help="a debug build (a dry run: its numbers mean nothing)")
    a = ap.parse_args()
    cmd = bench_command(a)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-4000:], file=sys.stderr)
        return 1
    result = json.loads(p.stdout.strip().splitlines()[-1])
    for row in result["codecs"]:
        print(f"{row['codec']:>22}: ratio {row['ratio']:.3f}  encode {row['encode_gbps_1core']:.2f} GB/s "
              f"(all {row['encode_gbps_all']:.2f})  decode {row['decode_gbps_1core']:.2f} GB/s "
              f"(all {row['decode_gbps_all']:.2f})", flush=True)
    write_record(a.out, {"build": "debug" if a.debug else "release", "bench_command": " ".join(cmd),
                         "results": result},
                 head=header(versions=versions("cargo", "rustc")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
