#!/usr/bin/env python3
"""Time to first token with and without kvtier, for a Llama-3-8B-shaped model on one GPU.

A random-weight model of Llama-3-8B's shape (32 layers, hidden 4096, 32 query
and 8 KV heads of 128, MLP 14336, vocabulary 128256; bf16, built on the GPU,
nothing downloaded; transformers' eager ``DynamicCache``) runs prompts of 4k,
16k and 32k tokens. For each length:

1. **recompute**: prefill of the whole prompt, next-token logits (median TTFT
   of ``--repeats`` runs after one warm-up);
2. **save**: every full 128-token block of that prefill's KV is gathered on the
   GPU, copied into pinned host memory in one transfer and written to kvtier
   under its chain key (``Client.keys_for``, parent to child), in writes of at
   most 128 MiB (the server takes messages up to 256 MiB);
3. **cached**: a Lookup, then on the same-host socket (``--load mapped``, the
   default there) ``Client.map_read(...)``: each kvtier segment pinned once
   read-only and every block DMA'd by the GPU straight from kvtier's shared
   memory on a side stream, no CPU copy (``perf/mapped_load.py``); or
   (``--load staged``, and over TCP) one ``Client.read_into(...)`` into a
   preallocated pinned buffer and one host-to-GPU copy; then the
   blocks viewed as the cache layout and put in a fresh ``DynamicCache``, then
   one forward over the uncached tail (``--tail``, default 1 token: a fully
   cached prompt still computes its last token, as vLLM does).

One block's payload is all layers' K and V of its 128 tokens, laid out
``[layer][K, V][kv head][token][dim]`` (bf16): 16 MiB for this shape.

Recorded per length: recompute and cached TTFT (medians, every sample kept),
the cached TTFT's split (lookup, read into pinned memory, host-to-GPU copy,
cache build, forward over the tail), load GB/s against a pinned-to-GPU copy of
the same bytes timed in the same run, save GB/s, peak GPU memory.

Checks (exit 1 if any fails): every block was stored; the loaded bytes equal
the saved ones; the cache built from them equals the prefill's K and V
exactly (first load); and the cached run's next-token logits match the
recompute's, compared in float32: the same top token, and ``max |cached -
recompute| <= 2**-4 * max |recompute|``. On an H200 the same tail forward
over the prefill's own cache (no kvtier involved) differed from the
recompute by 0.27-0.31 at a largest logit of 5.7-6.0, 2^-4.3 of it
(notes/042): the two runs take different bf16 attention kernels, so 2^-5
failed runs whose loaded bytes and cache were exact. For scale the record also gives, without checking them,
the difference of the same tail forward over the prefill's own cache (no
kvtier; the cached run should equal it) and over an all-zero cache (what a
load that copied nothing would give; with random weights the logits depend
little on the cache, which is why the byte check is there).

Transport: kvtier's same-host path (``serve --local-listen PATH``, client URL
``unix://PATH``) where the binary has it, else the TCP data plane
(``--transport``); ``transport`` in the record says which, ``data_plane`` what
the client used for payloads.

    PYTHONPATH=python python3 scripts/gpu-ttft.py --out DIR --kvtier target/release/kvtier

Writes DIR/record.json and DIR/summary.md; exits 1 if a check fails, 2 if it
cannot run. Sized for the 8-minute limit on an H100 (3 repeats per length,
GPU memory freed between lengths; ~45 GiB through kvtier in all).
``--device cpu`` runs the same code on a tiny shape (2 layers, hidden 64, 4
heads, 2 KV heads of 16) at 256 and 512 tokens in seconds: ``make test`` does
(python/tests/vllm/test_gpu_ttft.py). ``KVTIER_COMMIT`` names the commit where
the machine's copy of the tree has no usable .git.

Needs torch, transformers 5.x, grpcio, protobuf, xxhash, and the SDK's
native core (``python/kvtier/_native.abi3.so``, ``make native``: it computes
the checksums) or else **crc32c**:
without either, every payload's checksum is computed in pure Python (~10 MB/s,
hours at these sizes), so a CUDA run refuses to start. A machine that reaches
no package index takes it as a wheel fetched elsewhere,

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d .whl crc32c

installed there with ``python3 -m pip install -q --no-index --target
/tmp/site .whl/*.whl`` and ``PYTHONPATH=python:/tmp/site``. The kvtier binary
likewise comes from ``cargo build --release`` on a machine with crates.io.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _perf import ROOT  # noqa: F401 (puts perf and this checkout's SDK on sys.path)

import kvtier
from kvtier._crc import ACCELERATED as CRC_ACCELERATED
from kvtier.client import token_chain
from kvtier.dataplane import available as native_available
from perf import header as perf_header
from perf import versions
from perf.mapped_load import MappedLoads
from perf.services import find_binary, kvtier_server

NATIVE = native_available()

BLOCK = 128  # tokens per kvtier block
WRITE_BATCH = 128 << 20  # bytes per Write call
BIG_TIMEOUT = 300.0  # seconds for one read or write of up to 4 GiB
TOL_SCALE = 2.0 ** -4  # logits tolerance, relative to the largest reference logit
SHAPES = {
    "llama3-8b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
                  "intermediate": 14336, "vocab": 128256},
    "tiny": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 128,
             "vocab": 512},
}

checks: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> bool:
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    return bool(ok)


def fin(x: float):
    """A float for JSON: non-finite values as strings ("nan", "inf")."""
    return x if math.isfinite(x) else str(x)


class Clock:
    """Wall-clock intervals that end only once the device's queued work is done."""

    def __init__(self, dev: torch.device):
        self.dev = dev

    def sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()


def build_model(shape: dict, dev: torch.device, max_len: int):
    """A random-weight Llama of ``shape`` in bf16, created on ``dev`` directly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"], max_position_embeddings=max_len,
        rope_theta=500000.0, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    return model.eval()


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def forward(model, ids: torch.Tensor, cache) -> torch.Tensor:
    """One forward of ``ids`` on top of ``cache`` (which it extends); the next-token logits in float32."""
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].float()


def gather(cache, kv: torch.Tensor) -> None:
    """The cache's first ``len(kv)`` blocks into ``kv`` [block, layer, K/V, head, token, dim]."""
    nb = kv.shape[0]
    for i, layer in enumerate(cache.layers):
        for j, t in enumerate((layer.keys, layer.values)):
            kv[:, i, j] = t[0, :, :nb * BLOCK].unflatten(1, (nb, BLOCK)).transpose(0, 1)


def build_cache(model, kv: torch.Tensor, n_tokens: int):
    """A fresh cache holding the first ``n_tokens`` tokens of the blocks in ``kv``."""
    cache = new_cache(model)
    nb, layers, _, heads, _, dim = kv.shape
    for i in range(layers):
        k, v = (kv[:, i, j].transpose(0, 1).reshape(1, heads, nb * BLOCK, dim)[:, :, :n_tokens] for j in (0, 1))
        cache.update(k, v, i)
    return cache


def as_rows(kv: torch.Tensor) -> torch.Tensor:
    """``kv`` as one row of payload bytes per block."""
    return kv.view(torch.uint8).view(kv.shape[0], -1)


def corrupt(row: torch.Tensor, values_at: int) -> None:
    """Test hook: turns one bf16 value of layer 0's V in a loaded block into Inf or NaN by
    overwriting the byte that holds its exponent, as a torn or misaddressed copy could."""
    b = row.numpy()
    i = next((i for i in range(values_at, b.size // 2) if b[2 * i] & 0x80), None)  # exponent's low bit set
    b[2 * i + 1 if i is not None else 1] |= 0x7F  # little-endian: the high byte holds the other 7 bits


def median(xs) -> float:
    return statistics.median(xs)


def pinned(shape, dev: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.uint8, pin_memory=dev.type == "cuda")


def run_length(model, client: kvtier.Client, n: int, a, dev: torch.device, shape: dict) -> dict:
    clock = Clock(dev)
    layers, heads, dim = shape["layers"], shape["kv_heads"], shape["head_dim"]
    block_bytes = layers * 2 * heads * BLOCK * dim * 2
    cached = n - a.tail  # tokens taken from kvtier
    full = n // BLOCK  # full blocks of the prompt: what is saved
    nb = -(-cached // BLOCK)  # blocks loaded (the last one cut to ``cached``)
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, shape["vocab"], (1, n), generator=g).to(dev)
    keys = client.keys_for(ids[0].tolist())
    assert len(keys) == full
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    res: dict = {"tokens": n, "cached_tokens": cached, "tail_tokens": a.tail, "blocks_saved": full,
                 "blocks_loaded": nb, "block_bytes": block_bytes, "bytes_saved": full * block_bytes,
                 "bytes_loaded": nb * block_bytes}

    # 1. Recompute: the whole prompt, one warm-up first.
    with torch.inference_mode():
        forward(model, ids, new_cache(model))
        samples = []
        for _ in range(a.repeats):
            cache = new_cache(model)
            t0 = clock.now()
            ref = forward(model, ids, cache)
            samples.append((clock.now() - t0) * 1e3)
    res["recompute"] = {"ttft_ms": median(samples), "samples_ms": samples}
    print(f"{n} tokens: recompute {median(samples):.1f} ms", flush=True)

    # 2. Save: gather + one copy into pinned memory, then batched writes.
    kv = torch.empty((full, layers, 2, heads, BLOCK, dim), dtype=torch.bfloat16, device=dev)
    save_host = pinned((full, block_bytes), dev)
    payloads = [memoryview(save_host[i].numpy()) for i in range(full)]
    # Views of pinned memory, not copies: the SDK sends any buffer, though its annotation says bytes.
    chain = token_chain(keys, payloads, BLOCK, n)  # type: ignore[arg-type]
    per_call = max(1, WRITE_BATCH // block_bytes)
    batches = [chain[i:i + per_call] for i in range(0, full, per_call)]
    saves = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.write_threads) as pool:
        for r in range(a.repeats):
            ns = f"ttft-{n}-{r}"
            t0 = clock.now()
            with torch.inference_mode():
                gather(cache, kv)
            save_host.copy_(as_rows(kv))
            t1 = clock.now()
            results = list(pool.map(lambda batch, ns=ns: client.write(ns, batch, timeout=BIG_TIMEOUT), batches))
            t2 = time.perf_counter()
            stored = sum(w.stored for w in results)
            saves.append({"gather_ms": (t1 - t0) * 1e3, "write_ms": (t2 - t1) * 1e3, "stored": stored})
            if r < a.repeats - 1:
                client.delete(ns, keys[:1])  # the chain goes with its first block
    check(f"{n} tokens: every block stored", all(s["stored"] == full for s in saves),
          f"{[s['stored'] for s in saves]} of {full} blocks per repeat")
    gather_ms, write_ms = median(s["gather_ms"] for s in saves), median(s["write_ms"] for s in saves)
    res["save"] = {"gather_ms": gather_ms, "write_ms": write_ms,
                   "gbps": full * block_bytes / ((gather_ms + write_ms) / 1e3) / 1e9,
                   "write_gbps": full * block_bytes / (write_ms / 1e3) / 1e9, "batches": len(batches),
                   "blocks_per_write": per_call, "samples": saves}

    # The same tail forward over the prefill's own KV, no kvtier in between (for scale).
    tail = ids[:, cached:]
    with torch.inference_mode():
        control = forward(model, tail, build_cache(model, kv[:nb], cached))
    prefill = cache

    # 3. Cached: Lookup, read into pinned rows, one copy to the GPU, cache, tail forward.
    load_host = pinned((nb, block_bytes), dev)
    rows = [load_host[i].numpy() for i in range(nb)]
    dst = as_rows(kv[:nb])
    stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def h2d(part: slice) -> None:
        """Starts copying rows ``part`` to the GPU (on the side stream: the next part's read overlaps it)."""
        if stream is None:
            dst[part].copy_(load_host[part])
            return
        with torch.cuda.stream(stream):
            dst[part].copy_(load_host[part], non_blocking=True)

    def h2d_wait() -> None:
        if stream is not None:
            stream.synchronize()
            torch.cuda.current_stream(dev).wait_stream(stream)

    pipeline = max(1, a.pipeline or (4 if dev.type == "cuda" else 1))
    res["load_pipeline"] = pipeline
    mapped = MappedLoads(dev, stream) if a.load == "mapped" else None
    res["load_path"] = a.load
    loads, worst, top1, equal, same_cache = [], 0.0, True, True, False
    values_at = heads * BLOCK * dim  # element index of layer 0's V in a payload
    for _ in range(a.repeats + 1):  # the first is a warm-up, recorded apart
        load_host.zero_()
        kv.zero_()  # a load that does not reach the GPU must not find the saved KV there
        t0 = clock.now()
        hit = client.lookup(ns, keys=keys[:nb], lease_ms=60_000)
        t1 = time.perf_counter()
        # In `pipeline` parts: each part goes to the GPU while the next is read.
        step = -(-hit.found // pipeline) if hit.found else 1
        read = 0
        for start in range(0, hit.found, step):
            part = slice(start, min(start + step, hit.found))
            if mapped is not None:
                m = client.map_read(ns, keys[part], lease_id=hit.lease_id, timeout=BIG_TIMEOUT)
                landed_n = mapped.start(m, dst, start)
            else:
                got = client.read_into(ns, keys[part], rows[part], lease_id=hit.lease_id, timeout=BIG_TIMEOUT)
                landed_n = len(got.blocks)
                if a.corrupt_for_test and start <= nb // 2 < part.stop:
                    corrupt(load_host[nb // 2], values_at)
            read += landed_n
            if landed_n < part.stop - start:
                break
            if mapped is None:
                h2d(part)
        t2 = time.perf_counter()
        if mapped is not None:
            mapped.finish()
            if a.corrupt_for_test:
                corrupt(dst[nb // 2], values_at)
        h2d_wait()
        t3 = time.perf_counter()
        with torch.inference_mode():
            cache = build_cache(model, kv[:nb], cached)
            t4 = clock.now()
            logits = forward(model, tail, cache)
        t5 = clock.now()
        if hit.lease_id:
            client.release(hit.lease_id)
        loads.append({"lookup_ms": (t1 - t0) * 1e3, "read_ms": (t2 - t1) * 1e3, "h2d_ms": (t3 - t2) * 1e3,
                      "build_ms": (t4 - t3) * 1e3, "forward_ms": (t5 - t4) * 1e3, "total_ms": (t5 - t0) * 1e3,
                      "found": hit.found, "read": read})
        landed = load_host if mapped is None else dst[:nb].cpu()
        equal &= hit.found == nb and read == nb and torch.equal(landed, save_host[:nb])
        diff = (logits - ref).abs().max().item()
        worst = diff if math.isnan(diff) or diff > worst else worst  # a NaN stays
        top1 &= int(logits.argmax()) == int(ref.argmax())
        if prefill is not None:  # the first load: the rebuilt cache against the prefill's, exactly
            same_cache = all(torch.equal(getattr(b, t)[:, :, :cached], getattr(p, t)[:, :, :cached])
                             for b, p in zip(cache.layers, prefill.layers) for t in ("keys", "values"))
            prefill = None
            gc.collect()
        del cache
    warm, loads = loads[0], loads[1:]
    split = {k[:-3]: median(s[k] for s in loads) for k in ("lookup_ms", "read_ms", "h2d_ms", "build_ms",
                                                             "forward_ms")}
    ttft = median(s["total_ms"] for s in loads)
    res["cached"] = {"ttft_ms": ttft, "split_ms": split, "samples": loads, "warmup": warm}
    res["speedup"] = res["recompute"]["ttft_ms"] / ttft

    # Pinned -> GPU copy of the same bytes alone: the floor a load is measured against.
    floor = []
    for _ in range(a.repeats + 2):
        t0 = clock.now()
        h2d(slice(0, nb))
        h2d_wait()
        floor.append((clock.now() - t0) * 1e3)
    floor_ms = median(floor[1:])
    nbytes = nb * block_bytes
    load_ms = split["read"] + split["h2d"]
    res["load"] = {"gbps": nbytes / (load_ms / 1e3) / 1e9, "read_gbps": nbytes / (split["read"] / 1e3) / 1e9,
                   "h2d_gbps": nbytes / (split["h2d"] / 1e3) / 1e9, "h2d_floor_ms": floor_ms,
                   "h2d_floor_gbps": nbytes / (floor_ms / 1e3) / 1e9, "h2d_floor_samples_ms": floor}
    res["load"]["vs_h2d_floor"] = res["load"]["gbps"] / res["load"]["h2d_floor_gbps"]

    # What a load that copied nothing would give (for scale), then the checks.
    with torch.inference_mode():
        kv.zero_()
        zero = forward(model, tail, build_cache(model, kv[:nb], cached))
    scale = ref.abs().max().item()
    tol = TOL_SCALE * scale
    res["logits"] = {"max_abs_diff": fin(worst), "tolerance": tol, "max_abs_ref": scale,
                     "ok": worst <= tol and top1, "top1_equal": top1,
                     "control_max_abs_diff": (control - ref).abs().max().item(),
                     "cached_vs_control_max_abs_diff": fin((logits - control).abs().max().item()),
                     "zero_kv_max_abs_diff": (zero - ref).abs().max().item()}
    res["bytes_equal"] = bool(equal)
    res["cache_equal"] = same_cache
    check(f"{n} tokens: the cache built from kvtier's blocks equals the prefill's KV", same_cache,
          f"{layers} layers of K and V, {cached} tokens, first load")
    check(f"{n} tokens: loaded KV bytes equal the saved bytes", equal,
          f"{nb} blocks of {block_bytes} bytes, {a.repeats + 1} loads")
    check(f"{n} tokens: cached next-token logits match recompute", worst <= tol and top1,
          f"max |diff| {worst:.3g}, tolerance {tol:.3g} (2^-4 of max |logit| {scale:.3g}), float32; "
          f"same top token: {top1}")
    if dev.type == "cuda":
        res["peak_gpu_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    client.delete(ns, keys[:1])
    print(f"{n} tokens: cached {ttft:.1f} ms ({res['speedup']:.1f}x), load {res['load']['gbps']:.2f} GB/s "
          f"(h2d floor {res['load']['h2d_floor_gbps']:.1f}), save {res['save']['gbps']:.2f} GB/s", flush=True)
    return res


def header(dev: torch.device, binary: Path) -> dict:
    """perf's record header (date, commit, dirty, machine, command, versions), with the GPU."""
    import transformers

    rec = perf_header(env=["PYTHONPATH"], versions=versions("kvtier", paths={"kvtier": binary}, known={
        "torch": torch.__version__, "transformers": transformers.__version__, "kvtier_binary": str(binary)}))
    rec["versions"]["crc32c_accelerated"] = CRC_ACCELERATED
    # A device machine's copy of the tree may carry no (or a stale) .git: $KVTIER_COMMIT names the commit.
    if os.environ.get("KVTIER_COMMIT"):
        rec["commit"], rec["dirty"] = os.environ["KVTIER_COMMIT"], None
    m = rec["machine"]
    m["gpu"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "none (cpu dry run)"
    if dev.type == "cuda":
        m["gpu_memory_gib"] = round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1)
        m["cuda"] = torch.version.cuda
    return rec


def has_local_listen(binary: Path) -> bool:
    """Whether ``binary`` has the same-host socket (``serve --local-listen``)."""
    try:
        p = subprocess.run([str(binary), "serve", "--help"], check=False, capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--local-listen" in p.stdout


def connect(stack: contextlib.ExitStack, binary: Path, want: str, capacity: str, tmp: str, rec: dict,
            connections: int = 4):
    """A kvtier server and a client over ``want`` (auto: local where the binary has it, else tcp), checked
    with one small write and read; auto falls back to tcp when the local path does not work end to end."""
    local_ok = has_local_listen(binary)
    tries = {"auto": ["local", "tcp"] if local_ok else ["tcp"], "local": ["local"], "tcp": ["tcp"]}[want]
    notes = [] if local_ok or want == "tcp" else [f"{binary} has no `serve --local-listen`"]
    for transport in tries:
        sock = Path(tmp) / f"kvtier-{transport}.sock"
        args = ["--memory-capacity", capacity] + (["--local-listen", str(sock)] if transport == "local" else [])
        srv = kvtier_server(binary, args)
        target = f"unix://{sock}" if transport == "local" else srv.grpc
        # Big reads and writes give their own timeouts; a long prefix is striped
        # over the connections (on the same-host socket, copied by as many server threads).
        client = kvtier.Client(target, timeout=30.0, connections=connections, read_stripes=connections)
        try:
            client.write("ttft-probe", [kvtier.Block(key=b"probe", payload=b"kvtier" * 100)])
            if client.read("ttft-probe", [b"probe"]).payloads != [b"kvtier" * 100]:
                raise RuntimeError("the probe block read back differs")
        except Exception as e:  # noqa: BLE001 - any failure of this transport: the next one, or stop
            notes.append(f"{transport} ({target}) failed its probe: {e}".splitlines()[0])
            print(f"gpu-ttft: {notes[-1]}", file=sys.stderr, flush=True)
            client.close()
            srv.stop()
            continue
        stack.callback(srv.stop)
        stack.callback(client.close)
        dp = client.data_plane()
        rec.update({"transport": transport, "client_target": target, "transport_notes": notes,
                    "data_plane": "gRPC (no data plane)" if dp is None else repr(dp),
                    "copies_by_memory": dp is not None and dp.copies_by_memory})
        print(f"transport {transport}: client {target}, payloads via {rec['data_plane']}", flush=True)
        return client
    return None


def summary(rec: dict) -> str:
    m, c = rec["machine"], rec["config"]
    lines = [f"# TTFT with and without kvtier on {m['gpu']}", "",
             (f"{c['shape_name']} shape ({c['shape']['layers']} layers, {c['shape']['kv_heads']} KV heads of "
             f"{c['shape']['head_dim']}), bf16, random weights; {c['block_bytes'] / 2**10:g} KiB per "
             f"{BLOCK}-token block; tail of {c['tail']} token(s) computed. Transport: **{rec['transport']}** "
             f"(client {rec['client_target']}, payloads via {rec['data_plane']}). torch {rec['versions']['torch']}, "
             f"transformers {rec['versions']['transformers']}, kvtier {rec['versions']['kvtier']}, commit "
             f"{str(rec['commit'])[:12]}{' (dirty)' if rec['dirty'] else ''}. Medians of {c['repeats']} repeats."), "",
             ("| tokens | recompute | cached | speed-up | lookup | read | h2d | build | forward | load GB/s "
              "| h2d floor GB/s | load/floor | save GB/s | max logit diff (tol) | bytes equal |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if rec["transport_notes"]:
        lines[2:2] = ["Transport notes: " + "; ".join(rec["transport_notes"]) + ".", ""]
    for r in rec["lengths"]:
        s, lo, lg = r["cached"]["split_ms"], r["load"], r["logits"]
        diff = lg["max_abs_diff"]
        lines.append(
            f"| {r['tokens']} | {r['recompute']['ttft_ms']:.1f} ms | {r['cached']['ttft_ms']:.1f} ms "
            f"| {r['speedup']:.1f}x | {s['lookup']:.1f} | {s['read']:.1f} | {s['h2d']:.1f} | {s['build']:.1f} "
            f"| {s['forward']:.1f} | {lo['gbps']:.2f} | {lo['h2d_floor_gbps']:.1f} | {lo['vs_h2d_floor']:.2f} "
            f"| {r['save']['gbps']:.2f} | {diff if isinstance(diff, str) else f'{diff:.3g}'} "
            f"({lg['tolerance']:.3g}){'' if lg['ok'] else ' FAIL'} | {r['bytes_equal']} |")
    lines += ["", "Split columns in ms. Logits: float32, the same top token and a tolerance of 2^-4 of the largest recompute logit; "
              "for scale, the same tail forward over an all-zero cache differs by "
              + ", ".join(f"{r['logits']['zero_kv_max_abs_diff']:.3g}" for r in rec["lengths"]) + ".", "",
              f"{sum(ch['ok'] for ch in rec['checks'])} of {len(rec['checks'])} checks passed."]
    lines += [f"- FAIL {ch['check']}: {ch['detail']}" for ch in rec["checks"] if not ch["ok"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for record.json and summary.md")
    ap.add_argument("--kvtier", default=None, help="kvtier binary (default: $KVTIER_BIN, else target/{debug,release})")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run on a tiny shape")
    ap.add_argument("--lengths", default=None, help="prompt lengths, comma-separated (default 4096,16384,32768; "
                    "256,512 on cpu)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tail", type=int, default=1, help="tokens computed in the cached run (default 1)")
    ap.add_argument("--transport", choices=("auto", "local", "tcp"), default="auto",
                    help="local: serve --local-listen + unix:// client; tcp: the TCP data plane; auto: local "
                    "where the binary has it")
    ap.add_argument("--memory-capacity", default=None, help="kvtier memory tier (default 12GiB; 256MiB on cpu); "
                    "at least twice the longest prompt's KV, since a Lookup's lease pins at most half of it")
    ap.add_argument("--write-threads", type=int, default=4, help="Write calls in flight during a save")
    ap.add_argument("--pipeline", type=int, default=None,
                    help="parts a load is read in, each copied to the GPU while the next is read "
                         "(default 4 on cuda, 1 on cpu)")
    ap.add_argument("--connections", type=int, default=None,
                    help="client connections, and so read stripes (default 16 on cuda, 4 on cpu)")
    ap.add_argument("--load", choices=("auto", "mapped", "staged"), default="auto",
                    help="mapped: Client.map_read, the GPU DMAs from kvtier's shared memory (same-host socket); "
                         "staged: read_into pinned memory, then one host-to-GPU copy; auto: mapped where local")
    ap.add_argument("--corrupt-for-test", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    started = time.perf_counter()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu-ttft: no CUDA device visible to torch", file=sys.stderr)
        return 2
    if dev.type == "cuda" and not CRC_ACCELERATED and not NATIVE:
        print("gpu-ttft: the crc32c package is missing: every checksum would be computed in pure Python "
              "(~10 MB/s, hours for these sizes); install it (see the docstring)", file=sys.stderr)
        return 2
    shape_name = "tiny" if dev.type == "cpu" else "llama3-8b"
    shape = SHAPES[shape_name]
    lengths = [int(x) for x in (a.lengths or ("256,512" if dev.type == "cpu" else "4096,16384,32768")).split(",")]
    if a.repeats < 1 or not 1 <= a.tail or any(n - a.tail < BLOCK for n in lengths):
        ap.error(f"need --repeats >= 1, --tail >= 1 and every length >= tail + {BLOCK}")
    binary = Path(a.kvtier) if a.kvtier else find_binary()
    rec = header(dev, binary)
    rec["title"] = "TTFT with and without kvtier, Llama-3-8B-shaped model (scripts/gpu-ttft.py)"
    block_bytes = shape["layers"] * 2 * shape["kv_heads"] * BLOCK * shape["head_dim"] * 2
    rec["config"] = {"shape_name": shape_name, "shape": shape, "dtype": "bfloat16", "block_tokens": BLOCK,
                     "block_bytes": block_bytes, "payload_layout": "[layer][K,V][kv_head][token][dim]",
                     "lengths": lengths, "repeats": a.repeats, "tail": a.tail, "write_batch_bytes": WRITE_BATCH,
                     "write_threads": a.write_threads, "transport_requested": a.transport,
                     "local_listen_supported": has_local_listen(binary),
                     "logits_tolerance": "same top token, max|cached - recompute| <= 2^-4 * max|recompute| (float32)",
                     "corrupt_for_test": a.corrupt_for_test}
    capacity = a.memory_capacity or ("256MiB" if dev.type == "cpu" else "12GiB")
    rec["config"]["memory_capacity"] = capacity
    with tempfile.TemporaryDirectory(prefix="gpu-ttft-") as tmp, contextlib.ExitStack() as stack:
        connections = a.connections or (16 if dev.type == "cuda" else 4)
        client = connect(stack, binary, a.transport, capacity, tmp, rec, connections)
        if client is None:
            print(f"gpu-ttft: no transport works: {rec.get('transport_notes')}", file=sys.stderr)
            return 2
        if a.load == "auto":
            a.load = "mapped" if rec["transport"] == "local" else "staged"
        elif a.load == "mapped" and rec["transport"] != "local":
            print("gpu-ttft: --load mapped needs the same-host socket", file=sys.stderr)
            return 2
        rec["config"]["load"] = a.load
        t0 = time.perf_counter()
        model = build_model(shape, dev, max(lengths))
        rec["config"]["attn_implementation"] = model.config._attn_implementation
        rec["model_build_s"] = time.perf_counter() - t0
        print(f"model built in {rec['model_build_s']:.1f} s ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} "
              f"B parameters, {rec['config']['attn_implementation']})", flush=True)
        rec["lengths"] = []
        for n in lengths:
            rec["lengths"].append(run_length(model, client, n, a, dev, shape))
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    rec["checks"] = checks
    rec["passed"] = all(c["ok"] for c in checks)
    rec["wall_s"] = time.perf_counter() - started
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(rec, indent=1) + "\n")
    text = summary(rec)
    (out / "summary.md").write_text(text)
    print(text + f"wrote {out / 'record.json'} and {out / 'summary.md'} in {rec['wall_s']:.0f} s")
    return 0 if rec["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
