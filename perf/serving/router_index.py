"""What the cache-aware router knows of who holds which prefix: an index of
KV blocks built from the KV events of the engines (vLLM's own prefix cache)
and of kvtier nodes (docs/serving.md, "Cache-aware routing").

Events name blocks by their publisher's hash: vLLM's chained hash (per
process; random unless ``PYTHONHASHSEED`` is fixed), kvtier's
``sha256(namespace ‖ 0x00 ‖ key)``. Neither can be computed from a request's
tokens here, so the index keys every block by a hash of its own: a chain
over the block's TOKEN IDS, ``h_i = blake2b(h_{i-1} ‖ len ‖ tokens_i)``,
started from the token ids a ``BlockStored`` carries and the publisher's
``parent_block_hash``. A request's tokens, cut in blocks of a source's
block size, give the same chain, so the engine's and kvtier's block sizes
may differ: each source is queried at its own size and the overlap is
measured in tokens.

* A **source** is one publisher's holdings: an engine (one per replica) or
  a kvtier node (one per node, every namespace it publishes unless the
  router narrows them). Each block a source holds has the media it is on
  (vLLM ``GPU``; kvtier ``CPU``, ``DISK``, ``STORAGE``).
* A **domain** is a space of publisher hashes: an engine is its own; every
  kvtier node shares one, since a key's hash depends on the namespace and
  the key only. In a cluster a chain's blocks are spread over the nodes
  (docs/cluster.md, "Placement"), so a block's parent is often announced by
  another node: the parent's identity is looked up in the domain, and a
  block whose parent is not known yet waits (bounded) until it is.
* ``BlockStored`` with ``token_ids=[]`` (kvtier's tier-only update) adds a
  medium to a block whose identity the domain knows; ``BlockRemoved``
  removes one medium; ``AllBlocksCleared`` empties the source.
* A block announced without tokens whose identity is unknown (kvtier's form
  for a block written without its token ids) is kept under its publisher
  key only: a consumer that computes those keys from a prompt finds it
  (``Source.live``; the router does for kvtier, :func:`.router_events.kvtier_keys`).

What a block's KV also depends on beyond its tokens (vLLM's ``lora_name``
and ``extra_keys``: LoRA adapters, multimodal inputs, cache salts) is not
part of the index hash: one base model, text prompts.

Events are the decoded form (``router_events``): dicts with a ``type`` key,
as vLLM's ``KVEventBatch`` encodes them. Standard library only, so the
scoring tests run without vLLM.
"""
from __future__ import annotations

import hashlib
import struct
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Domain", "PrefixIndex", "Source", "chain"]

#: Identities kept per domain after their blocks left every tier (so that a
#: late child or a tier-only update still finds its chain), and blocks kept
#: waiting for a parent; oldest dropped first.
IDENTITIES = 1 << 18
PENDING = 1 << 16

_ROOT = b"\0" * 16


def _block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(struct.pack(f"<I{len(tokens)}q", len(tokens), *tokens))
    return h.digest()


def chain(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """The index's hash of each full ``block_size``-token block of ``tokens``."""
    out: list[bytes] = []
    parent = _ROOT
    for i in range(len(tokens) // block_size):
        parent = _block_hash(parent, tokens[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


@dataclass
class Domain:
    """Publisher hash -> the index's hash, for one space of publisher hashes."""

    name: str
    ident: OrderedDict[Hashable, tuple[bytes, int]] = field(default_factory=OrderedDict)
    """(scope, publisher hash) -> (index hash, block size)."""
    pending: OrderedDict[Hashable, list[tuple[Source, Hashable, list[int], int, str]]] = field(
        default_factory=OrderedDict)
    """parent key -> blocks announced before it: (source, key, tokens, block size, medium)."""
    waiting: int = 0

    def learn(self, key: Hashable, ours: bytes, block_size: int) -> None:
        self.ident[key] = (ours, block_size)
        self.ident.move_to_end(key)
        while len(self.ident) > IDENTITIES:
            self.ident.popitem(last=False)

    def wait(self, parent: Hashable, item: tuple[Source, Hashable, list[int], int, str]) -> None:
        self.pending.setdefault(parent, []).append(item)
        self.waiting += 1
        while self.waiting > PENDING:
            _, dropped = self.pending.popitem(last=False)
            self.waiting -= len(dropped)


@dataclass
class Source:
    """One publisher's blocks: an engine's prefix cache or one kvtier node."""

    name: str
    kind: str
    """``engine`` or ``kvtier``."""
    domain: Domain
    live: dict[Hashable, tuple[bytes, int, set[str]]] = field(default_factory=dict)
    """publisher key -> (index hash, block size, media it is on here)."""
    held: dict[bytes, Counter[str]] = field(default_factory=dict)
    """index hash -> medium -> publisher keys holding it there (a block may
    have several: one per KV-cache group or per tensor-parallel namespace)."""
    block_sizes: Counter[int] = field(default_factory=Counter)
    """block size -> live publisher keys of that size."""

    def media(self, ours: bytes) -> set[str]:
        c = self.held.get(ours)
        return set(c) if c else set()

    def add(self, key: Hashable, ours: bytes, block_size: int, medium: str) -> None:
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = (ours, block_size, set())
            self.block_sizes[block_size] += 1
        if medium in entry[2]:
            return
        entry[2].add(medium)
        self.held.setdefault(ours, Counter())[medium] += 1

    def remove(self, key: Hashable, medium: str | None) -> None:
        """Drops ``medium`` (every medium if None) of the block ``key``."""
        entry = self.live.get(key)
        if entry is None:
            return
        ours, bs, media = entry
        for m in list(media) if medium is None else [medium] if medium in media else []:
            media.discard(m)
            c = self.held[ours]
            c[m] -= 1
            if c[m] <= 0:
                del c[m]
            if not c:
                del self.held[ours]
        if not media:
            del self.live[key]
            self.block_sizes[bs] -= 1
            if self.block_sizes[bs] <= 0:
                del self.block_sizes[bs]

    def clear(self) -> None:
        self.live.clear()
        self.held.clear()
        self.block_sizes.clear()

    def run(self, tokens: Sequence[int], media: Iterable[str] | None = None,
            chains: dict[int, list[bytes]] | None = None) -> tuple[int, list[set[str]]]:
        """(block size, media of each leading block held here) at the block
        size with the longest run in tokens; only ``media`` count if given."""
        best: tuple[int, list[set[str]]] = (0, [])
        want = set(media) if media is not None else None
        for bs in [b for b in self.block_sizes if b > 0]:
            run: list[set[str]] = []
            for h in _chain_for(tokens, bs, chains):
                m = self.media(h)
                if want is not None:
                    m &= want
                if not m:
                    break
                run.append(m)
            if len(run) * bs > len(best[1]) * best[0]:
                best = (bs, run)
        return best


def _chain_for(tokens: Sequence[int], bs: int, chains: dict[int, list[bytes]] | None) -> list[bytes]:
    if chains is None:
        return chain(tokens, bs)
    if bs not in chains:
        chains[bs] = chain(tokens, bs)
    return chains[bs]


class PrefixIndex:
    """Every source's blocks, fed with decoded KV events."""

    def __init__(self) -> None:
        self.domains: dict[str, Domain] = {}
        self.sources: dict[str, Source] = {}
        self.counts: Counter[str] = Counter()

    def source(self, name: str, kind: str, domain: str) -> Source:
        s = self.sources.get(name)
        if s is None:
            d = self.domains.setdefault(domain, Domain(domain))
            s = self.sources[name] = Source(name, kind, d)
        return s

    def apply(self, source: Source, events: Iterable[Mapping[str, Any]], scope: Hashable = "") -> None:
        """Applies one batch's events from ``source``. ``scope`` separates
        publisher hashes that may repeat (a kvtier namespace); vLLM's
        ``group_idx`` is added to it."""
        for ev in events:
            kind = ev.get("type", "")
            self.counts[kind] += 1
            if kind == "BlockStored":
                self._stored(source, ev, scope)
            elif kind == "BlockRemoved":
                for h in ev.get("block_hashes") or ():
                    source.remove((scope, ev.get("group_idx") or 0, _hashable(h)), ev.get("medium"))
            elif kind == "AllBlocksCleared":
                source.clear()
            else:
                self.counts["unknown"] += 1

    def _stored(self, source: Source, ev: Mapping[str, Any], scope: Hashable) -> None:
        d = source.domain
        group = ev.get("group_idx") or 0  # absent in older vLLM and in kvtier's events: one group
        medium = ev.get("medium") or "GPU"
        hashes = [_hashable(h) for h in ev.get("block_hashes") or ()]
        tokens = list(ev.get("token_ids") or ())
        bs = int(ev.get("block_size") or 0)
        parent = ev.get("parent_block_hash")
        parent_key: Hashable = None if parent is None else (scope, group, _hashable(parent))
        for i, h in enumerate(hashes):
            key = (scope, group, h)
            blk = tokens[i * bs:(i + 1) * bs] if bs else []
            if not blk or len(blk) < bs:
                known = d.ident.get(key)
                if known is not None:  # a tier-only update
                    source.add(key, known[0], known[1], medium)
                else:  # written without tokens: found only by its publisher key (Scorer's keys)
                    self.counts["untokened"] += 1
                    source.add(key, _untokened(key), 0, medium)
            else:
                self._place(source, key, parent_key, blk, bs, medium)
            parent_key = key

    def _place(self, source: Source, key: Hashable, parent_key: Hashable, blk: list[int], bs: int,
               medium: str) -> None:
        d = source.domain
        todo = [(source, key, parent_key, blk, bs, medium)]
        while todo:
            src, key, parent_key, blk, bs, medium = todo.pop()
            if parent_key is None:
                up = _ROOT
            else:
                got = d.ident.get(parent_key)
                if got is None:
                    self.counts["waiting_for_parent"] += 1
                    d.wait(parent_key, (src, key, blk, bs, medium))
                    continue
                up = got[0]
            ours = _block_hash(up, blk)
            d.learn(key, ours, bs)
            src.add(key, ours, bs, medium)
            for child in d.pending.pop(key, ()):
                d.waiting -= 1
                todo.append((child[0], child[1], key, child[2], child[3], child[4]))

    def stats(self) -> dict[str, Any]:
        return {"events": dict(self.counts),
                "sources": {n: {"kind": s.kind, "blocks": len(s.held), "block_sizes": sorted(s.block_sizes)}
                            for n, s in self.sources.items()},
                "waiting": {n: d.waiting for n, d in self.domains.items()}}


def _untokened(key: Hashable) -> bytes:
    """An index hash for a block whose tokens are unknown: no token chain gives it."""
    return b"\xff" + hashlib.blake2b(repr(key).encode(), digest_size=15).digest()


def _hashable(h: Any) -> Hashable:
    return bytes(h) if isinstance(h, (bytes, bytearray, memoryview)) else h
