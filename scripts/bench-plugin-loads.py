#!/usr/bin/env python3
"""How fast the engine plugins load a KV prefix into their own memory,
against the SDK's ``read_into`` and the floors, on this machine:
notes/060-same-host-fixes.

One release ``kvtier serve`` (memory tier, ``--local-listen``) holds a
128-block prefix (128 × 4 MiB, as a 16k-token prefix of the 184.6M test
model; and 128 × 1.2 MB). In every repeat, in alternating order, the whole
prefix is loaded into one buffer the caller allocated (touched beforehand)
by:

* ``memcpy``: one single-thread copy of the same bytes (the floor);
* ``tcp-loopback``: the same bytes over one loopback TCP stream (the link a
  TCP load crosses);
and, on the same-host socket (``-local``) and over the TCP data plane
(``-tcp``):
* ``read_into``: ``Client.read_into`` with one slice of the buffer per key;
* ``read-into-sizes``: ``Client.read(into=callable, sizes=...)``, the
  callable handing out the same slices;
* ``read-into``: ``Client.read(into=callable)`` without sizes (each payload
  arrives as new ``bytes`` and is copied into its slice: the call as it was);
* ``lmcache``: the LMCache plugin's load (``KvtierRemoteConnector._read``,
  what ``get`` and ``batched_get_non_blocking`` run on their threads), its
  memory objects handed out from the buffer as LMCache's CPU backend hands
  them out of its arena;
* ``sglang``: the SGLang backend's ``batch_get_v1`` into a host pool laid out
  page-first (each page a K and a V segment), the pool being the buffer.

The plugins' client is made as the plugins make theirs (4 connections, one
retry, no waiting on shed requests), shared by every variant of a transport.
Where LMCache is not installed its connector runs on stand-in base classes
(the plugin's load uses nothing of them); SGLang's backend needs none. Each
variant's count of native reads that return new ``bytes`` is recorded (a
fast path must have none). Each figure is a median over the repeats; every
sample is in the record.

With ``--ab-binary B`` (another build of the server: notes/060 used one
with the pidfd peer checks of the copies the same-host socket had then
taken out), a second server on its own socket holds the same prefix, and
``read_into`` and ``read-into-sizes`` on it (``-nocheck``, the name kept
for the records) alternate with the rest: what the difference costs a
same-host load.

    .venv/bin/python scripts/bench-plugin-loads.py [--out notes/060-same-host-fixes.json] [--repeat 5] \
        [--ab-binary /tmp/kvtier-nocheck]

Needs ``cargo build --release -p kvtier`` and the native module
(``PYTHON=.venv/bin/python scripts/build-native.sh``).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from _perf import ROOT

from kvtier import Block, Client, dataplane
from kvtier.sglang import KvtierHiCache
from perf import alternate, header, summarize, versions, write_record
from perf.floors import memcpy, tcp_loopback
from perf.services import kvtier_server, release_binary

SIZES = {"4MiB": 4 << 20, "1.2MB": 1_200_000}
BLOCKS = 128
NS = "plugin-loads"
CALLS = ("read_into", "read-into-sizes", "read-into", "lmcache", "sglang")
#: The calls run on the server without peer checks, with --ab-binary.
AB_CALLS = ("read_into", "read-into-sizes")
#: Variants that must never take the native read that returns new bytes.
STRAIGHT = ("read_into", "read-into-sizes", "lmcache", "sglang")


def lmcache_connector() -> tuple[type, str]:
    """The LMCache plugin's connector class, and what it runs on."""
    try:
        import lmcache  # noqa: F401
    except ImportError:
        # Stand-ins for the two base classes kvtier.lmcache imports; its load
        # (``_read``) calls none of their methods.
        names = ["lmcache", "lmcache.v1", "lmcache.v1.storage_backend", "lmcache.v1.storage_backend.connector",
                 "lmcache.v1.storage_backend.connector.base_connector"]
        for n in names:
            sys.modules[n] = types.ModuleType(n)
        conn, base = sys.modules[names[3]], sys.modules[names[4]]
        conn.ConnectorAdapter = type("ConnectorAdapter", (), {})  # type: ignore[attr-defined]
        conn.ConnectorContext = object  # type: ignore[attr-defined]
        base.RemoteConnector = type("RemoteConnector", (), {})  # type: ignore[attr-defined]
        on = "stand-in base classes (LMCache not installed in this venv)"
    else:
        from importlib.metadata import version

        on = f"lmcache {version('lmcache')}"
    from kvtier.lmcache import KvtierRemoteConnector

    return KvtierRemoteConnector, on


class Arena:
    """LMCache's CPU backend as the load meets it: memory objects of one
    chunk each, handed out of one buffer allocated beforehand."""

    class Obj:
        def __init__(self, view: memoryview):
            self.byte_array = view

        def ref_count_down(self) -> None:
            pass

    def __init__(self, buf: bytearray, size: int):
        self.view, self.size, self.next = memoryview(buf), size, 0

    def allocate(self, *args: Any, **kwargs: Any) -> Arena.Obj:
        i, self.next = self.next, self.next + 1
        return Arena.Obj(self.view[i * self.size:(i + 1) * self.size])


class PageFirstPool:
    """SGLang's page-first host pool as ``get_page_buffer_meta`` shows it:
    page ``p`` is a K segment and a V segment, here halves of one slice of
    the buffer (the ``host_indices`` given are page numbers)."""

    def __init__(self, buf: bytearray, page: int):
        self._c = (ctypes.c_char * len(buf)).from_buffer(buf)
        self.base, self.page = ctypes.addressof(self._c), page

    def get_page_buffer_meta(self, pages: list[int]) -> tuple[list[int], list[int]]:
        half = self.page // 2
        ptrs = [a for p in pages for a in (self.base + p * self.page, self.base + p * self.page + half)]
        return ptrs, [half, self.page - half] * len(pages)


def plugins(client: Client, dst: bytearray, size: int, connector: type) -> tuple[Any, Any]:
    """The LMCache connector and the SGLang backend, each on ``client`` and loading into ``dst``."""
    lm: Any = object.__new__(connector)
    lm.client = client
    lm.local_cpu_backend = Arena(dst, size)
    lm.full_chunk_size_bytes, lm.single_token_size = size, size // 128  # 128 tokens a chunk
    lm.meta_shapes = lm.meta_dtypes = lm.meta_fmt = None
    from kvtier.lmcache import _RateLimited  # importable once lmcache_connector() has run

    lm.stats, lm._warn = {"bad_size": 0}, _RateLimited()
    lm.namespace = lambda key: NS
    sg = KvtierHiCache(types.SimpleNamespace(extra_config={"url": "127.0.0.1:1"}), {})
    sg.client.close()
    sg.client = client
    sg.mem_pool_host, sg.nbuf, sg.page_bytes, sg.namespace = PageFirstPool(dst, size), 2, size, NS
    return lm, sg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "notes" / "060-same-host-fixes.json"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--blocks", type=int, default=BLOCKS, help="blocks in the prefix (a dry run takes fewer)")
    ap.add_argument("--kvtier", default=None, help="the server binary (default: target/release/kvtier)")
    ap.add_argument("--ab-binary", default=None,
                    help="another server build to compare on the same prefix (the -nocheck rows), for an A/B")
    a = ap.parse_args()
    sizes = {k: SIZES[k] for k in a.sizes.split(",")}
    blocks = a.blocks
    binary = Path(a.kvtier) if a.kvtier else release_binary()
    connector, lmcache_on = lmcache_connector()
    biggest = max(sizes.values()) * blocks
    src, dst = bytearray(biggest), bytearray(biggest)
    for i in range(0, biggest, 4096):  # touched: no first-touch page faults in the timings
        src[i], dst[i] = i // 4096 % 251, 1
    # Counts the native reads that return new bytes (the path the plugins left).
    bytes_reads = [0]
    native_read = dataplane.DataPlane.read

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        bytes_reads[0] += 1
        return native_read(self, *args, **kwargs)

    dataplane.DataPlane.read = counted  # type: ignore[method-assign]
    sock = Path(tempfile.mkdtemp(prefix="kvtier-plugin-loads-")) / "kvtier.sock"
    floors = ["memcpy", "tcp-loopback"]
    variants = floors + [f"{c}-{t}" for t in ("local", "tcp") for c in CALLS]
    if a.ab_binary:
        variants += [f"{c}-nocheck" for c in AB_CALLS]
    seconds: dict[str, dict[str, list[float]]] = {}
    reads: dict[str, dict[str, int]] = {}
    server_args = ["--memory-capacity", "1GiB", "--max-block-size", "16MiB"]
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(kvtier_server(binary, args=["--local-listen", str(sock), *server_args]))
        opts = {"connections": 4, "timeout": 60.0, "retries": 1, "retry_shed": False}
        clients = {"local": Client(f"unix://{sock}", **opts), "tcp": Client(srv.grpc, same_host=False, **opts)}
        if a.ab_binary:
            ab_sock = sock.with_name("kvtier-nocheck.sock")
            stack.enter_context(kvtier_server(Path(a.ab_binary), args=["--local-listen", str(ab_sock), *server_args]))
            clients["nocheck"] = Client(f"unix://{ab_sock}", **opts)
        for t, c in clients.items():
            pool = c.data_plane()
            assert pool is not None and pool.copies_by_memory == (t != "tcp"), f"{t}: {pool}"
        for label, size in sizes.items():
            nbytes = size * blocks
            keys = [f"{label}-{i:06}".encode() for i in range(blocks)]
            view = memoryview(src)
            for at in range(0, blocks, 16):  # within the server's request memory
                for t in clients.keys() - {"tcp"}:  # "tcp" is the "local" server
                    w = clients[t].write(NS, [Block(k, view[i * size:(i + 1) * size], token_count=128)
                                              for i, k in enumerate(keys) if at <= i < at + 16])
                    assert w.stored + w.existing == min(16, blocks - at), w
            slices = [memoryview(dst)[i * size:(i + 1) * size] for i in range(blocks)]
            harness = {t: plugins(c, dst, size, connector) for t, c in clients.items()}
            lm_keys = [types.SimpleNamespace(chunk_hash_hex=k.decode()) for k in keys]
            sg_keys = [k.decode() for k in keys]
            counts: dict[str, int] = {v: 0 for v in variants}

            def run(v: str, rep: int, size: int = size, nbytes: int = nbytes, keys: list[bytes] = keys,
                    slices: list[memoryview] = slices, harness: dict = harness, lm_keys: list = lm_keys,
                    sg_keys: list[str] = sg_keys, counts: dict = counts, label: str = label) -> float:
                if rep == 0:  # checked below: the load must have put every byte there
                    ctypes.memset((ctypes.c_char * nbytes).from_buffer(dst), 0, nbytes)
                before = bytes_reads[0]
                call, _, t = v.rpartition("-")
                if v == "memcpy":
                    took = memcpy(nbytes, src, dst)
                elif v == "tcp-loopback":
                    took = tcp_loopback(nbytes, src, dst)
                else:
                    c, (lm, sg) = clients[t], harness[t]
                    start = time.perf_counter()
                    if call == "read_into":
                        n = len(c.read_into(NS, keys, slices).blocks)
                    elif call == "read-into-sizes":
                        n = len(c.read(NS, keys, into=lambda idx, _: slices[idx], sizes=size).blocks)
                    elif call == "read-into":
                        n = len(c.read(NS, keys, into=lambda idx, _: slices[idx]).blocks)
                    elif call == "lmcache":
                        lm.local_cpu_backend.next = 0
                        n = len(lm._read(lm_keys))
                    else:
                        n = sum(sg.batch_get_v1(sg_keys, list(range(len(sg_keys)))))
                    took = time.perf_counter() - start
                    assert n == len(keys), f"{v}: {n} of {len(keys)} blocks loaded"
                if rep == 0:
                    assert dst[:nbytes] == src[:nbytes], f"{v}: loaded bytes differ"
                counts[v] += bytes_reads[0] - before
                print(f"{label} rep {rep} {v}: {nbytes / took / 1e9:.2f} GB/s", flush=True)
                return took

            seconds[label] = alternate(variants, a.repeat, run, log=None)
            reads[label] = counts
            for v in (v for v in variants if v not in floors and v.rpartition("-")[0] in STRAIGHT):
                assert counts[v] == 0, f"{v} read through new bytes {counts[v]} times"
            for t in clients.keys() - {"tcp"}:
                clients[t].delete(NS, keys)
        for c in clients.values():
            c.close()
    dataplane.DataPlane.read = native_read  # type: ignore[method-assign]
    results: dict[str, Any] = {}
    for label, per in seconds.items():
        nbytes = sizes[label] * blocks
        rate = {v: nbytes / summarize(xs).median / 1e9 for v, xs in per.items()}
        results[label] = {
            v: {"gbps_median": round(rate[v], 3),
                "vs_memcpy": round(rate[v] / rate["memcpy"], 3),
                **({} if v in floors else {"vs_read_into": round(rate[v] / rate[f"read_into-{v.rpartition('-')[2]}"], 3),
                                           "native_bytes_reads": reads[label][v]}),
                "seconds": [round(x, 6) for x in xs],
                "outliers": summarize(xs).as_dict()["outliers"]}
            for v, xs in per.items()
        }
        r = results[label]
        r["targets"] = {
            **{f"{c}-local >= 0.7x memcpy": r[f"{c}-local"]["vs_memcpy"] >= 0.7
               for c in ("read-into-sizes", "lmcache", "sglang")},
            **{f"{c}-tcp >= 0.9x read_into-tcp": r[f"{c}-tcp"]["vs_read_into"] >= 0.9
               for c in ("read-into-sizes", "lmcache", "sglang")},
        }
        if a.ab_binary:
            # The A/B: the same call on the same-host socket, with and without the checks.
            r["peer_check_cost"] = {c: round(1 - rate[f"{c}-local"] / rate[f"{c}-nocheck"], 4) for c in AB_CALLS}
            r["targets"].update({f"peer checks cost {c} < 2 %": r["peer_check_cost"][c] < 0.02 for c in AB_CALLS})
    fields = {
        "what": "a prefix loaded into a caller's buffer by read_into, read(into=...) and the LMCache and SGLang "
                "plugins' own loads, vs one memcpy and one loopback TCP stream",
        "blocks": blocks,
        "sizes": sizes,
        "repeats": a.repeat,
        "lmcache_connector_on": lmcache_on,
        "client": "connections=4, retries=1, retry_shed=False (the plugins' settings); timeout 60 s",
        "ab_binary": a.ab_binary,
        "results": results,
    }
    write_record(a.out, fields, header(versions=versions("kvtier", paths={"kvtier": binary})))
    print(json.dumps({k: {v: x.get("gbps_median", x) for v, x in r.items()} for k, r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
