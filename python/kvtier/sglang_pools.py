"""The pools of SGLang's hybrid models on kvtier: what :class:`kvtier.sglang.KvtierHiCache`
needs for SGLang's v2 pool-transfer interface (``docs/sglang.md``, "Hybrid models").

A hybrid model keeps other state next to its KV pages, each kind in a host
pool of its own that SGLang names (``PoolName``): sliding-window KV
(``swa``), Mamba states (``mamba``), DeepSeek's indexer and compressed pools.
Every pool's pages go by the KV pages' keys, so each pool gets a namespace of
its own (its name and layout in the digest) and two pools never share a key.

How much of a prefix a pool can restore follows its hit policy
(``PoolHitPolicy``): ALL_PAGES needs every page before the hit, so one Lookup
answers it; TRAILING_PAGES needs only the last N pages before the hit (SWA's
window; N = 1 for a Mamba state), so a hit is restorable at some lengths and
not at others: :class:`Trailing` finds the longest with Lookups of the window
read backwards.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

ALL_PAGES, TRAILING_PAGES, BLOCK_GROUPS = "all_pages", "trailing_pages", "block_groups"
KV = "kv"
#: Pools sharded over TP ranks even when the model's KV is MLA (the same on every
#: rank): SGLang backs them up from every rank (``should_backup``).
RANK_SHARDED = {"mamba"}
#: Lookups one TRAILING_PAGES pool may take in one ``batch_exists_v2``: each one
#: settles a candidate length and skips every length whose window holds the page
#: found missing. Past it the hit is the longest one proven so far (shorter, never wrong).
TRAILING_PROBES = 16
#: Pages a probe asks for below the window (SGLang's own storage batch): what
#: it finds there proves shorter lengths restorable too, for free.
PROBE_BELOW = 128
#: Pages of a pool: kvtier segments of the page (``get_page_buffer_meta``), one
#: flat page copied in and out (``get_data_page``, for pools without segments),
#: no bytes at all (a logical anchor), or unusable (every transfer a miss).
SEGMENTS, FLAT, NONE, BROKEN = "segments", "flat", "none", "broken"


def name_of(name: Any) -> str:
    """A pool's name as a plain string (``PoolName`` is a str enum)."""
    return str(getattr(name, "value", name))


def policy_of(transfer: Any) -> str:
    return str(getattr(transfer.hit_policy, "value", transfer.hit_policy))


def views(ptrs, sizes) -> list[memoryview]:
    """Writable byte views of raw host memory segments (the pool's pages)."""
    return [memoryview((ctypes.c_char * n).from_address(p)).cast("B") for p, n in zip(ptrs, sizes)]


def flat_view(t) -> memoryview:
    """The bytes of a host tensor (a flat data page), writable."""
    return memoryview(t.contiguous().view(-1).view(__import__("torch").uint8).numpy()).cast("B")


@dataclass
class Pool:
    """One host pool of SGLang's and where its pages live in kvtier."""

    name: str
    host: Any
    namespace: str
    mode: str
    page_size: int = 1
    #: Segments of one page (SEGMENTS) and the bytes of one page.
    nbuf: int = 0
    page_bytes: int = 0

    def segments(self, host_indices) -> list[list[memoryview]]:
        """Per page, writable views of its segments in the host pool."""
        ptrs, sizes = self.host.get_page_buffer_meta(host_indices)
        pages = len(host_indices) // self.page_size
        if len(ptrs) != self.nbuf * pages:
            raise ValueError(f"{self.name}: {len(ptrs)} segments for {pages} pages of {self.nbuf}")
        vs = views(ptrs, sizes)
        return [vs[i:i + self.nbuf] for i in range(0, len(vs), self.nbuf)]

    def first_index(self, host_indices, i: int) -> int:
        return int(host_indices[i * self.page_size])


def probe(host) -> tuple[str, int, list[int]]:
    """How the pool's pages are laid out: (mode, tokens per page, the sizes of
    one page's segments, or the flat page's size)."""
    import torch

    page = int(getattr(host, "page_size", 1) or 1)
    try:
        meta = host.get_page_buffer_meta(torch.arange(page, dtype=torch.int64))
    except (NotImplementedError, ValueError, AssertionError):
        # Pools whose pages are not plain segments (a Mamba pool with side
        # states): whole flat pages, the way SGLang's file backend moves them.
        dummy = host.get_dummy_flat_data_page()
        n = dummy.numel() * dummy.element_size()
        return (FLAT, page, [n]) if n else (BROKEN, page, [])
    if meta is None:  # a logical anchor: its indices only, the data in other pools
        return NONE, page, []
    return SEGMENTS, page, [int(s) for s in meta[1]]


def namespace(prefix: str, slug: str, facts: dict) -> str:
    """``[prefix]sglang/<model>/<pool>/<digest>`` within kvtier's 128 bytes; the
    digest covers every fact, so a cut pool name still separates."""
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]
    pool = re.sub(r"[^A-Za-z0-9._-]", "-", str(facts["pool"]))
    return f"{prefix}sglang/{slug}/{pool}/"[:128 - len(digest)] + digest


def pool_facts(base: dict, name: str, host, mode: str, page: int, sizes: list[int]) -> dict:
    """What changes one pool's page bytes, next to the model's and rank's facts."""
    facts = dict(base, pool=name, pool_class=type(host).__name__, mode=mode, page_size=page, segments=sizes,
                 layout=getattr(host, "layout", None),
                 storage_format=getattr(host, "storage_format_tag", None))
    for attr in ("dtype", "temporal_dtype", "conv_dtype", "layer_num", "num_mamba_layers", "head_num", "head_dim",
                 "v_head_dim", "item_bytes"):
        if hasattr(host, attr):
            facts[attr] = str(getattr(host, attr))
    return facts


class Trailing:
    """What one ``batch_exists_v2`` learns of a TRAILING_PAGES pool: runs of pages
    found present and pages found missing. The prefix of length ``p`` is
    restorable when the ``window`` pages before it are all present."""

    def __init__(self, window: int, lookup: Callable[[int, int], int | None]):
        self.window = window
        # lookup(p, n): how many of the n pages before p are present, counting
        # down from page p-1; None when out of time or probes.
        self.lookup = lookup
        self.present: list[tuple[int, int]] = []
        self.missing: set[int] = set()

    def ranges(self) -> list[tuple[int, int]]:
        """The lengths proven restorable, as inclusive ranges: a run of pages
        [a, b) holds the window of every length from a + window (from 1 when
        the run starts at page 0) to b."""
        out = [(1 if a == 0 else a + self.window, b) for a, b in self.present]
        return [(lo, hi) for lo, hi in out if lo <= hi]

    def known(self, p: int) -> bool | None:
        if any(lo <= p <= hi for lo, hi in self.ranges()):
            return True
        if self.blocker(p) is not None:
            return False
        return None

    def blocker(self, p: int) -> int | None:
        """The last page found missing in the window before length ``p``."""
        lo = max(0, p - self.window)
        return max((m for m in self.missing if lo <= m < p), default=None)

    def longest(self, hi: int) -> int | None:
        """The longest restorable prefix up to ``hi`` pages (0: none), or ``None``
        when the lookups ran out before it was settled."""
        p = hi
        while p > 0:
            k = self.known(p)
            if k is None:
                n = min(p, self.window + PROBE_BELOW)
                found = self.lookup(p, n)
                if found is None:
                    return None
                self.present.append((p - found, p))
                if found < n:
                    self.missing.add(p - found - 1)
                k = self.known(p)
            if k:
                return p
            # Every length whose window holds that page fails too: go below it.
            p = self.blocker(p) or 0
        return 0


def _meet(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(max(x, u), min(y, v)) for x, y in a for u, v in b if max(x, u) <= min(y, v)]


def fold(kv_pages: int, bounds: list[int], trailing: list[Trailing]) -> tuple[int, list[int]]:
    """The longest prefix every pool can restore, and every length proven
    restorable up to it. ``bounds``: ALL_PAGES pools' leading runs."""
    hi = min([kv_pages, *bounds])
    while hi > 0:
        new: int | None = hi
        for t in trailing:
            new = t.longest(new) if new else new
            if new is None:
                break
        if new is None or new == hi:
            break
        hi = new
    proven = [(1, hi)] if hi > 0 else []
    for t in trailing:
        proven = _meet(proven, t.ranges())
    # Out of lookups, the hit is the longest length proven for every pool.
    hi = max((h for _, h in proven), default=0)
    return hi, sorted({p for lo, h in proven for p in range(lo, h + 1)})


def verdict(t: Trailing, kv_pages: int) -> int:
    """The pool's own boundary: its longest restorable prefix within the KV hit."""
    n = t.longest(kv_pages)
    if n is not None:
        return n
    return max((min(h, kv_pages) for lo, h in t.ranges() if lo <= kv_pages), default=0)
