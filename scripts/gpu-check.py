#!/usr/bin/env python3
"""The vLLM connector's GPU path, checked and measured on a real CUDA device.

CI has no GPU, so ``make test`` runs the connector's copies on the CPU only
(python/tests/vllm/test_units_layout.py runs the batched path there too). This script
is what a machine with a GPU runs:

1. correctness: for bf16, fp16 and fp8 caches, contiguous and permuted
   (NHD-stored) layouts, and kernel blocks of 1 or 2 per scheduler block,
   ``PayloadLayout.gather`` on CUDA gives byte for byte the payload the CPU
   path gives (a block saved by a GPU engine loads in a CPU engine and back),
   and ``scatter_many``/``scatter_layer`` put exactly those tiles back and
   touch no other block;
2. end to end: payloads gathered on the GPU are written to a real kvtier
   server (loopback), read back, scattered into a fresh GPU cache and
   compared;
3. speed: gather and scatter of 64 blocks of a Llama-3-8B-shaped cache (32
   layers, 8 KV heads, 16-token blocks, K+V of 128 each: 2 MiB per block),
   per-tile vs batched, against one contiguous copy of the same bytes
   (the hardware's floor) measured in the same run; medians over repeats.

    PYTHONPATH=python python3 scripts/gpu-check.py --out DIR [--kvtier target/release/kvtier]

Writes DIR/record.json and DIR/summary.md; exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import _perf  # noqa: F401 (puts perf and the SDK on sys.path)
import torch

from kvtier.vllm.layout import PayloadLayout
from perf import header, versions

checks: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)


def caches(layers, blocks, heads, tokens, content, dtype, device, permuted, seed):
    """``layers`` [B, H, N, C] caches; ``permuted`` stores them [B, N, H, C] underneath."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(layers):
        raw = torch.randint(-100, 100, (blocks, tokens, heads, content), generator=g, dtype=torch.int8)
        t = raw.to(torch.float32).div_(8).to(dtype) if dtype.itemsize > 1 else raw.view(dtype)
        t = t.to(device)
        out[f"model.layers.{i}.attn"] = t.permute(0, 2, 1, 3) if permuted else t.permute(0, 2, 1, 3).contiguous()
    return out


def zeros_like(cs, permuted):
    if permuted:
        return {k: torch.zeros(v.permute(0, 2, 1, 3).shape, dtype=v.dtype, device=v.device).permute(0, 2, 1, 3)
                for k, v in cs.items()}
    return {k: torch.zeros_like(v) for k, v in cs.items()}


def bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def correctness(dev) -> None:
    block = 16
    for dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        for permuted in (False, True):
            for split in (1, 2):
                tag = f"{str(dtype).split('.')[-1]} {'NHD' if permuted else 'HND'} kernel-blocks={split}"
                blocks = 12 * split
                gpu = caches(4, blocks, 8, block // split, 32, dtype, dev, permuted, seed=split)
                cpu = {k: v.cpu() for k, v in gpu.items()}
                names = list(gpu)
                ids = [9, 0, 4, 11, 6]
                want = PayloadLayout(cpu, names, block, batched=False).gather(ids)
                for batched in (False, True):
                    got = PayloadLayout(gpu, names, block, batched=batched).gather(ids)
                    check(f"gather {tag} {'batched' if batched else 'per-tile'} = CPU payload",
                          got.device.type == "cpu" and (got.is_pinned() or dev.type == "cpu") and torch.equal(got, want))
                payloads = [bytes(r.numpy()) for r in want]
                targets = [1, 2, 3, 7, 10]
                for batched in (False, True):
                    dst = zeros_like(gpu, permuted)
                    PayloadLayout(dst, names, block, batched=batched).scatter_many(targets, payloads)
                    ok = True
                    for k in names:
                        d, s = bits(dst[k]), bits(gpu[k])
                        for i, t in zip(ids, targets):
                            ok &= torch.equal(d[t * split:(t + 1) * split], s[i * split:(i + 1) * split])
                        for u in set(range(12)) - set(targets):
                            ok &= not d[u * split:(u + 1) * split].any()
                    check(f"scatter_many {tag} {'batched' if batched else 'per-tile'}: tiles in place, others untouched",
                          ok)
                dst = zeros_like(gpu, permuted)
                lay = PayloadLayout(dst, names, block)
                for layer in range(len(names)):
                    lay.scatter_layer(layer, 5, payloads[0])
                check(f"scatter_layer {tag}",
                      all(torch.equal(bits(dst[k])[5 * split:6 * split], bits(gpu[k])[9 * split:10 * split])
                          for k in names))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn, repeats, warmup=3):
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out), out


def speed(dev, repeats) -> dict:
    layers, heads, block, content, n = 32, 8, 16, 256, 64
    total_blocks = 1024
    cs = caches(layers, total_blocks, heads, block, content, torch.bfloat16, dev, True, seed=7)
    names = list(cs)
    ids = list(range(3, 3 + 4 * n, 4))  # spread out, as a real prefix's blocks are
    per_tile = PayloadLayout(cs, names, block, batched=False)
    batched = PayloadLayout(cs, names, block, batched=True)
    nbytes = n * batched.nbytes
    payloads = [bytes(r.numpy()) for r in batched.gather(ids)]
    targets = list(range(1, 1 + 4 * n, 4))
    floor_src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    floor_pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    res = {"shape": {"layers": layers, "kv_heads": heads, "block_tokens": block, "content": content,
                     "dtype": "bfloat16", "layout": "NHD", "blocks_per_call": n, "payload_bytes": batched.nbytes,
                     "bytes_per_call": nbytes}, "repeats": repeats, "ms": {}, "samples_ms": {}}
    runs = {
        "d2h_floor": lambda: floor_pinned.copy_(floor_src),
        "h2d_floor": lambda: floor_src.copy_(floor_pinned),
        "gather_per_tile": lambda: per_tile.gather(ids),
        "gather_batched": lambda: batched.gather(ids),
        "scatter_per_tile": lambda: per_tile.scatter_many(targets, payloads),
        "scatter_batched": lambda: batched.scatter_many(targets, payloads),
    }
    for _ in range(2):  # two rounds, interleaved: drift hits every variant alike
        for name, fn in runs.items():
            m, samples = median_ms(fn, repeats)
            res["samples_ms"].setdefault(name, []).extend(samples)
    for name, samples in res["samples_ms"].items():
        res["ms"][name] = statistics.median(samples)
    ms = res["ms"]
    res["gbps"] = {k: nbytes / (v / 1e3) / 1e9 for k, v in ms.items()}
    res["ratios"] = {
        "gather_batched_over_per_tile_speedup": ms["gather_per_tile"] / ms["gather_batched"],
        "scatter_batched_over_per_tile_speedup": ms["scatter_per_tile"] / ms["scatter_batched"],
        "gather_batched_vs_d2h_floor": ms["d2h_floor"] / ms["gather_batched"],
        "scatter_batched_vs_h2d_floor": ms["h2d_floor"] / ms["scatter_batched"],
    }
    check("batched gather is faster than per-tile", ms["gather_batched"] < ms["gather_per_tile"],
          f"{ms['gather_batched']:.2f} ms vs {ms['gather_per_tile']:.2f} ms")
    check("batched scatter is faster than per-tile", ms["scatter_batched"] < ms["scatter_per_tile"],
          f"{ms['scatter_batched']:.2f} ms vs {ms['scatter_per_tile']:.2f} ms")
    return res


def end_to_end(dev, kvtier_bin: str, repeats: int) -> dict:
    from kvtier import Block, Client
    from perf.services import find_binary, kvtier_server

    layers, heads, block, content, n = 32, 8, 16, 256, 64
    cs = caches(layers, 256, heads, block, content, torch.bfloat16, dev, True, seed=11)
    names = list(cs)
    lay = PayloadLayout(cs, names, block)
    ids = list(range(0, 4 * n, 4))
    keys = [f"blk-{i:04d}".encode() for i in range(n)]
    out = {}
    with kvtier_server(kvtier_bin or find_binary(), ["--memory-capacity", "4GiB"]) as srv, Client(srv.grpc) as c:
        saves, loads = [], []
        for r in range(repeats):
            ns = f"gpu-check/{r}"
            t0 = time.perf_counter()
            rows = lay.gather(ids)
            t1 = time.perf_counter()
            c.write(ns, [Block(key=k, payload=memoryview(row.numpy())) for k, row in zip(keys, rows)])
            t2 = time.perf_counter()
            got = c.read(ns, keys)
            t3 = time.perf_counter()
            dst = zeros_like(cs, True)
            back = PayloadLayout(dst, names, block)
            t4 = time.perf_counter()
            back.scatter_many(ids, got.payloads)
            t5 = time.perf_counter()
            # What the connector's worker does on a GPU: receive into pinned rows.
            dst2 = zeros_like(cs, True)
            back2 = PayloadLayout(dst2, names, block)
            t6 = time.perf_counter()
            host = back2.host_rows(n)
            if host is None:  # a CPU dry run: host_rows saves nothing there
                host = torch.empty((n, lay.nbytes), dtype=torch.uint8)
            got2 = c.read(ns, keys, into=lambda i, size, host=host: host[i].numpy())
            t7 = time.perf_counter()
            back2.scatter_many(ids, got2.payloads, host=host)
            t8 = time.perf_counter()
            saves.append({"gather_ms": (t1 - t0) * 1e3, "write_ms": (t2 - t1) * 1e3})
            loads.append({"read_ms": (t3 - t2) * 1e3, "scatter_ms": (t5 - t4) * 1e3,
                          "read_into_pinned_ms": (t7 - t6) * 1e3, "scatter_from_pinned_ms": (t8 - t7) * 1e3})
            if r == 0:
                check("end to end: GPU -> kvtier -> GPU, every block byte-identical",
                      len(got.blocks) == n and all(torch.equal(bits(dst[k])[ids], bits(cs[k])[ids]) for k in names),
                      f"{n} blocks of {lay.nbytes} bytes through {srv.grpc}")
                check("end to end, received into pinned rows: every block byte-identical",
                      len(got2.blocks) == n and all(torch.equal(bits(dst2[k])[ids], bits(cs[k])[ids]) for k in names))
        for key in ("gather_ms", "write_ms"):
            out[key] = statistics.median(s[key] for s in saves)
        for key in ("read_ms", "scatter_ms", "read_into_pinned_ms", "scatter_from_pinned_ms"):
            out[key] = statistics.median(s[key] for s in loads)
        out["bytes_per_call"] = n * lay.nbytes
        out["save_gbps"] = out["bytes_per_call"] / ((out["gather_ms"] + out["write_ms"]) / 1e3) / 1e9
        out["load_gbps"] = out["bytes_per_call"] / ((out["read_ms"] + out["scatter_ms"]) / 1e3) / 1e9
        out["load_into_pinned_gbps"] = out["bytes_per_call"] / (
            (out["read_into_pinned_ms"] + out["scatter_from_pinned_ms"]) / 1e3) / 1e9
        out["repeats"] = repeats
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kvtier", default=None, help="kvtier binary for the end-to-end check (default: find it)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run of the script itself")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    dev = torch.device(a.device)
    rec = header(versions=versions(known={"torch": torch.__version__, "cuda": torch.version.cuda}))
    if a.kvtier:
        rec["versions"].update(versions("kvtier", paths={"kvtier": a.kvtier}))
    # A device machine's copy of the tree may carry no (or a stale) .git: $KVTIER_COMMIT names the commit.
    if os.environ.get("KVTIER_COMMIT"):
        rec["commit"], rec["dirty"] = os.environ["KVTIER_COMMIT"], None
    rec["machine"]["gpu"] = torch.cuda.get_device_name(0) if dev.type == "cuda" else "none (cpu dry run)"
    correctness(dev)
    rec["speed"] = speed(dev, a.repeats)
    rec["end_to_end"] = end_to_end(dev, a.kvtier, max(3, a.repeats // 2))
    rec["checks"] = checks
    failed = [c for c in checks if not c["ok"]]
    rec["passed"] = not failed
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(rec, indent=2) + "\n")  # rec starts with perf's header
    s, e = rec["speed"], rec["end_to_end"]
    lines = [f"# GPU check on {rec['machine']['gpu']} (torch {rec['versions']['torch']})", "",
             f"{len(checks) - len(failed)} of {len(checks)} checks passed.", "",
             f"Speed, {s['shape']['blocks_per_call']} blocks of {s['shape']['payload_bytes']} bytes per call, "
             f"median of {2 * s['repeats']}:", "", "| step | ms | GB/s |", "|---|---|---|"]
    lines += [f"| {k} | {v:.3f} | {s['gbps'][k]:.1f} |" for k, v in s["ms"].items()]
    lines += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in s["ratios"].items()]
    lines += ["", "End to end through kvtier (loopback):", "", "| step | ms |", "|---|---|"]
    lines += [f"| {k} | {e[k]:.2f} |" for k in ("gather_ms", "write_ms", "read_ms", "scatter_ms",
                                                 "read_into_pinned_ms", "scatter_from_pinned_ms")]
    lines += [f"| {k} | {e[k]:.2f} |" for k in ("save_gbps", "load_gbps", "load_into_pinned_gbps")]
    if failed:
        lines += ["", "Failed:"] + [f"- {c['check']}: {c['detail']}" for c in failed]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
