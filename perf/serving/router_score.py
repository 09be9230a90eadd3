"""The cache-aware router's choice: which replica serves a request, from
the prefix each replica could reuse and the load each one carries, in the
spirit of NVIDIA Dynamo's KV router cost function (the prefill a replica
would still compute, plus the work already queued on it, the lowest wins).
Written as a score, higher is better::

    score(r) = credit(r) - load(r)

``credit(r)``, in tokens: the request's leading tokens that replica ``r``
would not compute, each weighted by where its KV is (docs/serving.md,
"Cache-aware routing"). The engine's own prefix cache covers the first
``e`` tokens; kvtier's leading run covers blocks past those (the engine
loads from kvtier only what its own cache lacks). At most the prompt less
one token: vLLM always computes the last one.

=========================  ======  =============================================
tier (event medium)        weight  why
=========================  ======  =============================================
engine (vLLM ``GPU``)      1.0     reused in place: no transfer, no compute
kvtier memory, own node    0.9     a copy from the node's shared memory over the
                                   same-host socket (docs/local.md): GB/s,
                                   orders of magnitude under the prefill it saves
kvtier disk, own node      0.7     a local disk read before the copy
kvtier memory, other node  0.6     one network hop: the own node reads it from
                                   its owner (docs/cluster.md, "Requests")
kvtier disk, other node    0.5     the hop and the owner's disk read
kvtier object store        0.3     ``STORAGE``: tens of ms to a first byte
=========================  ======  =============================================

A block held in several places counts at its best weight for that
replica; which node is "own" is the replica -> node mapping the router is
given.

``load(r)``, in the same tokens of prefill work, Dynamo's two terms:

* ``pending_prefill_token`` (1.0) per prompt token routed to ``r`` whose
  first output token has not come back yet, each request counted at its
  prompt less the credit it was routed with: a prefill queued ahead of this
  one delays it as much as computing as many of its own tokens;
* ``active_token`` (1.0) per token of context (prompt and requested
  output) of each request on ``r`` not finished: a running request's whole
  context is read at every decode step, and vLLM runs the new request's
  prefill in those steps. Dynamo weighs an active block as a block of
  prefill (its default ``overlap_score_weight`` of 1); so does this. With
  a flat 32 tokens per running request instead, the cache-aware routers
  kept every conversation on one replica while its decodes held the new
  prefills back (in one run of scripts/bench-routing.py on a two-core
  machine, no perf record: TTFT p99 several times round-robin's);
* ``inflight_request`` (0) per request on ``r``, for a flat per-request cost.

So a replica holding a long history keeps its conversation while it is
not much busier than the others; a short shared prefix (a system prompt)
loses to any queue; with kvtier's events, a replica that can load the
history from kvtier is close behind the one holding it, so load decides
sooner. The highest score wins; equal scores go round-robin, starting
after the replica chosen last.

Standard library only: python/tests/test_router_scoring.py feeds it
synthetic events.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .router_index import PrefixIndex, chain

__all__ = ["DEFAULT_WEIGHTS", "Load", "Score", "Scorer", "describe", "parse_weights"]

#: A prompt's kvtier publisher keys: per namespace, (block size, each full block's key).
KeysFn = Callable[[Sequence[int]], list[tuple[int, list[Hashable]]]]

DEFAULT_WEIGHTS: dict[str, float] = {
    "engine": 1.0,
    "kvtier_memory_local": 0.9,
    "kvtier_disk_local": 0.7,
    "kvtier_memory_remote": 0.6,
    "kvtier_disk_remote": 0.5,
    "kvtier_storage": 0.3,
    "pending_prefill_token": 1.0,
    "active_token": 1.0,
    "inflight_request": 0.0,
}

#: kvtier's event media (``kvtier serve --kv-events``: CPU its memory tier, DISK,
#: STORAGE the object store) -> the weight name's part; any other counts as storage.
_MEDIA = {"CPU": "memory", "DISK": "disk"}

#: The engine media that are the replica's own prefix cache.
ENGINE_MEDIA = ("GPU",)


def parse_weights(items: Sequence[str]) -> dict[str, float]:
    """``NAME=VALUE`` overrides of :data:`DEFAULT_WEIGHTS`."""
    w = dict(DEFAULT_WEIGHTS)
    for item in items:
        name, _, value = item.partition("=")
        if name not in w or not value:
            raise ValueError(f"--weight {item!r}: expected NAME=VALUE with NAME one of {sorted(w)}")
        w[name] = float(value)
    return w


@dataclass
class Load:
    """The router's own view of each replica's work."""

    inflight: list[int]
    pending_prefill: list[float]
    active: list[float] = field(default_factory=list)
    """Tokens of context (prompt and requested output) of the requests in flight."""

    @classmethod
    def empty(cls, n: int) -> Load:
        return cls([0] * n, [0.0] * n, [0.0] * n)


@dataclass
class Score:
    replica: int
    engine_tokens: int
    kvtier_tokens: int
    credit: float
    load: float
    tiers: dict[str, int] = field(default_factory=dict)
    """Tokens credited per weight name."""

    @property
    def score(self) -> float:
        return self.credit - self.load


class Scorer:
    """Scores replicas on a :class:`PrefixIndex`.

    ``engines[r]``: the index source of replica ``r``'s engine (None: no
    events from it). ``nodes[r]``: the kvtier node replica ``r`` reads
    through (None: no own node; every kvtier block counts as remote).
    ``kvtier_keys``: computes a prompt's kvtier publisher keys, to find
    blocks kvtier announced without their tokens.
    """

    def __init__(self, index: PrefixIndex, engines: Sequence[str | None], nodes: Sequence[str | None] = (),
                 weights: Mapping[str, float] | None = None, use_kvtier: bool = True,
                 kvtier_keys: KeysFn | None = None):
        self.index, self.engines = index, list(engines)
        self.nodes = list(nodes) + [None] * (len(self.engines) - len(nodes))
        self.w = {**DEFAULT_WEIGHTS, **(weights or {})}
        self.use_kvtier = use_kvtier
        self.kvtier_keys = kvtier_keys
        self.last = -1

    def _kvtier_run(self, tokens: Sequence[int], chains: dict[int, list[bytes]]) -> tuple[int, list[dict[str, set[str]]]]:
        """kvtier's leading run over every node: (block size, per block the
        media each node holds it on). A chain's blocks are spread over the
        nodes, and any node serves any block, so the run goes on while some
        node holds the next block."""
        nodes = [s for s in self.index.sources.values() if s.kind == "kvtier"]
        sizes = {b for s in nodes for b in s.block_sizes if b > 0}
        best: tuple[int, list[dict[str, set[str]]]] = (0, [])
        for bs in sizes:
            run: list[dict[str, set[str]]] = []
            hashes = chains[bs] if bs in chains else chains.setdefault(bs, chain(tokens, bs))
            for h in hashes:
                where = {s.name: m for s in nodes if (m := s.media(h))}
                if not where:
                    break
                run.append(where)
            if len(run) * bs > len(best[1]) * best[0]:
                best = (bs, run)
        if self.kvtier_keys is not None:  # blocks found by kvtier's own keys (announced without tokens)
            for bs, keys in self.kvtier_keys(tokens):
                run = []
                for k in keys:
                    where = {s.name: set(s.live[k][2]) for s in nodes if k in s.live}
                    if not where:
                        break
                    run.append(where)
                if len(run) * bs > len(best[1]) * best[0]:
                    best = (bs, run)
        return best

    def _block_weight(self, own: str | None, where: Mapping[str, set[str]]) -> tuple[float, str]:
        best = (0.0, "")
        for node, media in where.items():
            for m in media:
                kind = _MEDIA.get(m)
                name = "kvtier_storage" if kind is None else f"kvtier_{kind}_{'local' if node == own else 'remote'}"
                if self.w[name] > best[0]:
                    best = (self.w[name], name)
        return best

    def scores(self, tokens: Sequence[int], load: Load) -> list[Score]:
        chains: dict[int, list[bytes]] = {}
        cap = max(0, len(tokens) - 1)
        kv_bs, kv_run = self._kvtier_run(tokens, chains) if self.use_kvtier else (0, [])
        out = []
        for r, name in enumerate(self.engines):
            src = self.index.sources.get(name) if name is not None else None
            e = 0
            if src is not None:
                bs, run = src.run(tokens, ENGINE_MEDIA, chains)
                e = min(len(run) * bs, cap)
            tiers = {"engine": e} if e else {}
            credit = self.w["engine"] * e
            for j, where in enumerate(kv_run):
                lo, hi = max(j * kv_bs, e), min((j + 1) * kv_bs, cap)
                if hi <= lo:
                    continue
                w, tier = self._block_weight(self.nodes[r], where)
                credit += w * (hi - lo)
                tiers[tier] = tiers.get(tier, 0) + hi - lo
            penalty = (self.w["pending_prefill_token"] * load.pending_prefill[r]
                       + self.w["active_token"] * (load.active[r] if r < len(load.active) else 0.0)
                       + self.w["inflight_request"] * load.inflight[r])
            out.append(Score(r, e, min(len(kv_run) * kv_bs, cap), credit, penalty, tiers))
        return out

    def choose(self, tokens: Sequence[int], load: Load) -> tuple[int, list[Score]]:
        """The replica to route to, and every replica's score."""
        scores = self.scores(tokens, load)
        top = max(s.score for s in scores)
        tied = [s.replica for s in scores if s.score >= top - 1e-9]
        n = len(scores)
        pick = min(tied, key=lambda r: (r - self.last - 1) % n)
        self.last = pick
        return pick, scores


def describe(scores: Sequence[Score]) -> list[dict[str, Any]]:
    return [{"replica": s.replica, "score": s.score, "credit": s.credit, "load": s.load, "tiers": s.tiers}
            for s in scores]
