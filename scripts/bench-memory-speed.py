#!/usr/bin/env python3
"""How fast a KV prefix moves between kvtier and a buffer the caller
allocated, against the floor, on this machine: notes/042-memory-speed.

One release ``kvtier serve`` (memory tier, ``--local-listen``). For each
block size (a 128 × 4 MiB prefix, as a 16k-token prefix of the 184.6M test
model; and 128 × 1.2 MB), in every repeat and in alternating order:

* ``memcpy``: one single-thread copy of the same bytes between two
  preallocated buffers (``ctypes.memmove``): the floor;
* ``memcpy-fresh``: the same copy into memory just taken from the kernel
  (an untouched anonymous mapping, faulted in and zeroed page by page as
  the copy touches it), as a store must take fresh memory for what it
  saves: the floor of a save, which the preallocated floor does not pay;
* ``tcp-loopback``: the same bytes sent over one loopback TCP connection
  and received into the destination buffer (a sender thread, the receiver
  in this one): what one stream of the link a TCP client's load crosses
  moves on this host;
* ``crc32c``: one CRC32C pass over the same bytes (the checksum a store
  keeps with each block, and the client's end-to-end check);
* ``py-local`` / ``py-tcp``: the Python SDK (``kvtier.Client``: the native
  core) on the same-host socket and on the TCP data plane: ``write`` from
  slices of one caller buffer, ``read_into`` slices of another, as the vLLM
  connector does with its staging rows;
* ``py-map``: the Python SDK's ``map_read`` on the same-host socket: the
  prefix left in kvtier's shared memory, its addresses returned, then
  released, with no copy (what a GPU engine pays before its DMA from the
  mapping; its save is ``py-local``'s);
* ``rust-local`` / ``rust-tcp``: the Rust client core itself
  (``crates/kvtier-client/examples/memspeed.rs``), the same operations;
* ``mooncake``: Mooncake Store's ``put_from`` / ``get_into`` through its own
  Python API from a separate process (``kvtier bench``'s driver, one
  worker, the same value size), GB/s over a fixed duration.

Load = read of the whole prefix into the buffer; save = write of it. Each
figure is a median over the repeats; every sample is in the record.

    .venv/bin/python scripts/bench-memory-speed.py [--out notes/042-memory-speed.json] [--repeat 5]

Needs ``cargo build --release -p kvtier`` and
``cargo build --release -p kvtier-client --example memspeed``, ``make native``,
and Mooncake (``scripts/setup-mooncake.sh``) unless ``--no-mooncake``.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import crc32c
from _perf import ROOT

from kvtier import Block, Client
from perf import floors, header, versions, write_record
from perf.services import Mooncake, kvtier_server, mooncake_python, release_binary

MEMSPEED = Path(os.environ.get("KVTIER_MEMSPEED") or ROOT / "target" / "release" / "examples" / "memspeed")
DRIVER = ROOT / "crates/kvtier-bench/src/competitors/mooncake_driver.py"
SIZES = {"4MiB": 4 << 20, "1.2MB": 1_200_000}
BLOCKS = 128


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def memcpy(nbytes: int, src: bytearray, dst: bytearray) -> dict[str, float]:
    took = floors.memcpy(nbytes, src, dst)
    return {"load": took, "save": took}


def memcpy_fresh(nbytes: int, src: bytearray) -> dict[str, float]:
    region = mmap.mmap(-1, nbytes)
    s = (ctypes.c_char * nbytes).from_buffer(src)
    d = (ctypes.c_char * nbytes).from_buffer(region)
    t = time.perf_counter()
    ctypes.memmove(d, s, nbytes)
    took = time.perf_counter() - t
    del d
    region.close()
    return {"load": took, "save": took}


def tcp_loopback(nbytes: int, src: bytearray, dst: bytearray) -> dict[str, float]:
    took = floors.tcp_loopback(nbytes, src, dst)
    return {"load": took, "save": took}


def crc_pass(nbytes: int, src: bytearray) -> dict[str, float]:
    view = memoryview(src)[:nbytes]
    t = time.perf_counter()
    crc32c.crc32c(view)
    took = time.perf_counter() - t
    return {"load": took, "save": took}


def python_client(target: str, same_host: bool, size: int, src: bytearray, dst: bytearray, tag: str,
                  mapped: bool = False) -> dict:
    """Two rounds on one client: the first on fresh connections ("cold": on
    the same-host socket each connection maps the segments it reads and is
    lent, and faults in, the segment it saves through), the second on the
    same connections, as an engine's are after its first request ("load" and
    "save")."""
    with Client(target, connections=8, timeout=120, same_host=same_host) as c:
        pool = c.data_plane()
        assert pool is not None, "no data plane"
        want = "unix" if same_host else "tcp"
        assert pool.transport == want, f"{tag}: transport {pool.transport}, wanted {want}"
        view, into = memoryview(src), memoryview(dst)
        out: dict[str, Any] = {"copies_by_memory": pool.copies_by_memory}
        for rnd in ("cold_", ""):
            keys = [f"{tag}-{rnd}{time.time_ns()}-{i:06}".encode() for i in range(BLOCKS)]
            blocks = [Block(k, view[i * size:(i + 1) * size], token_count=128) for i, k in enumerate(keys)]
            t = time.perf_counter()
            w = c.write("memspeed", blocks)
            out[rnd + "save"] = time.perf_counter() - t
            assert w.stored == BLOCKS, w
            if mapped:
                t = time.perf_counter()
                m = c.map_read("memspeed", keys)
                got, regions = len(m.blocks), m.regions
                first, last = ctypes.string_at(*regions[0]), ctypes.string_at(*regions[-1])
                m.release()
                out[rnd + "load"] = time.perf_counter() - t
                assert got == BLOCKS, m.reason
                assert first == src[:size] and last == src[(BLOCKS - 1) * size:BLOCKS * size], "mapped bytes differ"
            else:
                bufs = [into[i * size:(i + 1) * size] for i in range(BLOCKS)]
                t = time.perf_counter()
                r = c.read_into("memspeed", keys, bufs)
                out[rnd + "load"] = time.perf_counter() - t
                assert len(r.blocks) == BLOCKS, r.reason
                assert dst[:size * BLOCKS] == src[:size * BLOCKS], "loaded bytes differ"
                # Overwritten (still mapped), so the next round's check sees its own load.
                ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(dst)), 1, size * BLOCKS)
            c.delete("memspeed", keys)
        return out


def rust_client(target: str, size: int, grpc: str) -> dict[str, float]:
    p = subprocess.run([str(MEMSPEED), target, str(BLOCKS), str(size), "2", grpc], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"memspeed exited {p.returncode}: {p.stderr[-3000:]}")
    out = p.stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    cold = {r["op"]: r["seconds"] for r in reversed(rows)}  # the first repeat: fresh connections
    warm = {r["op"]: r["seconds"] for r in rows}  # the second, on the same connections
    return {"load": warm["load"], "save": warm["save"], "cold_load": cold["load"], "cold_save": cold["save"]}


def mooncake(m: Mooncake, size: int, duration: float) -> dict[str, float]:
    """Seconds per prefix of BLOCKS values, from the driver's op rate at one worker."""
    res = {}
    for op, name in (("get", "load"), ("put", "save")):
        cmd = [str(mooncake_python()), str(DRIVER), "run", "--master", m.info["master"], "--metadata",
               m.info["metadata"], "--op", op, "--concurrency", "1", "--duration", str(duration), "--warmup",
               "0.5", "--value-size", str(size), "--keys", str(BLOCKS)]
        r = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout)
        if r["errors"] or not r["ops"]:
            raise RuntimeError(f"mooncake {op}: {r['errors']} errors {r['error_samples']}")
        res[name] = duration / r["ops"] * BLOCKS
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "notes" / "042-memory-speed.json"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mooncake-duration", type=float, default=3.0)
    ap.add_argument("--no-mooncake", action="store_true")
    ap.add_argument("--sizes", default=",".join(SIZES))
    a = ap.parse_args()
    sizes = {k: SIZES[k] for k in a.sizes.split(",")}
    biggest = max(sizes.values()) * BLOCKS
    src = bytearray(biggest)
    for i in range(0, biggest, 4096):
        src[i] = i // 4096 % 251  # touched: no first-touch page faults in the timings
    dst = bytearray(biggest)
    for i in range(0, biggest, 4096):
        dst[i] = 1
    sock = Path(tempfile.mkdtemp(prefix="kvtier-memspeed-")) / "kvtier.sock"
    samples: dict[str, dict[str, dict[str, list[float]]]] = {}
    mc = None if a.no_mooncake else Mooncake.start(mem_bytes=2 << 30)
    variants = ["memcpy", "memcpy-fresh", "tcp-loopback", "crc32c", "py-local", "py-map", "py-tcp", "rust-local",
                "rust-tcp"] + ([] if mc is None else ["mooncake"])
    try:
        with kvtier_server(args=["--local-listen", str(sock), "--memory-capacity", "4GiB",
                                 "--max-block-size", "16MiB"]) as srv:
            local, tcp = f"unix://{sock}", srv.grpc
            data = srv.ready["data"]
            for label, size in sizes.items():
                nbytes = size * BLOCKS
                per = samples.setdefault(label, {v: {"load": [], "save": []} for v in variants})
                for rep in range(a.repeat):
                    order = variants if rep % 2 == 0 else list(reversed(variants))
                    for v in order:
                        if v == "memcpy":
                            r: dict[str, Any] = memcpy(nbytes, src, dst)
                        elif v == "memcpy-fresh":
                            r = memcpy_fresh(nbytes, src)
                        elif v == "tcp-loopback":
                            r = tcp_loopback(nbytes, src, dst)
                        elif v == "crc32c":
                            r = crc_pass(nbytes, src)
                        elif v == "py-local":
                            r = python_client(local, True, size, src, dst, v)
                            assert r["copies_by_memory"], "the same-host socket fell back to bytes"
                        elif v == "py-map":
                            r = python_client(local, True, size, src, dst, v, mapped=True)
                        elif v == "py-tcp":
                            r = python_client(tcp, False, size, src, dst, v)
                        elif v == "rust-local":
                            r = rust_client(local, size, tcp)
                        elif v == "rust-tcp":
                            r = rust_client(data, size, tcp)
                        else:
                            assert mc is not None
                            r = mooncake(mc, size, a.mooncake_duration)
                        for op in ("load", "save", "cold_load", "cold_save"):
                            if op in r:
                                per[v].setdefault(op, []).append(r[op])
                        print(f"{label} rep {rep} {v}: load {gbps(nbytes, r['load']):.2f} GB/s, "
                              f"save {gbps(nbytes, r['save']):.2f} GB/s", flush=True)
    finally:
        mc_version = None if mc is None else mc.version()
        if mc is not None:
            mc.stop()
    results: dict[str, Any] = {}
    for label, per in samples.items():
        nbytes = SIZES[label] * BLOCKS
        floor = {op: gbps(nbytes, statistics.median(per["memcpy"][op])) for op in ("load", "save")}
        results[label] = {
            v: {op: {"gbps_median": round(gbps(nbytes, statistics.median(xs)), 3),
                     "vs_memcpy": round(gbps(nbytes, statistics.median(xs)) / floor[op.removeprefix("cold_")], 3),
                     "seconds": [round(x, 6) for x in xs]}
                for op, xs in ops.items()}
            for v, ops in per.items()
        }
    fields = {
        "what": "a 128-block prefix loaded into / saved from a caller-allocated buffer, vs one memcpy",
        "blocks": BLOCKS,
        "sizes": sizes,
        "repeats": a.repeat,
        "results": results,
    }
    known = {} if mc_version is None else {"mooncake": mc_version}
    write_record(a.out, fields, header(versions=versions("kvtier", paths={"kvtier": release_binary()}, known=known)))
    print(json.dumps({k: {v: {op: x["gbps_median"] for op, x in ops.items()} for v, ops in r.items()}
                      for k, r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
