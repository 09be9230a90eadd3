"""A seeded multi-turn chat trace shaped like seed 001's workload: every
conversation starts with one shared system prompt, and each turn sends the
whole history so far plus a new user message.

The trace is a JSONL file in the format of vLLM's ``custom`` benchmark
dataset (``{"prompt": ..., "output_tokens": ...}``, extra keys ignored), in
arrival order: turn 1 of every user, then turn 2 of every user, and so on.
With an odd number of users and a round-robin router over two replicas,
consecutive turns of one conversation land on different replicas, which is
the case a shared cache exists for (docs/serving.md).

The assistant replies in the history are text from the trace, not what the
engine generated (an open-loop trace, as ShareGPT replays are), so each
prompt extends the previous turn's prompt and the best any cache can do is
computable from the trace alone: :func:`infinite_cache_hits`.

Text is words of random letters and digits, the alphabet the test models'
tokenizer was trained on (``kvtier.vllm.testing``); words are joined by
single spaces, so with a byte-level pre-tokenizer a prompt's tokens are the
previous prompt's tokens followed by the new words' tokens.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["TraceSpec", "Turn", "add_arguments", "from_arguments", "generate", "infinite_cache_hits", "read_trace",
           "token_counts", "write_trace"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True)
class TraceSpec:
    """What to generate; the defaults are the note's trace."""

    users: int = 5
    """Conversations. Odd, so a round-robin over two replicas alternates each user's turns."""
    turns: int = 5
    system_words: int = 150
    """The shared system prompt (about 4.6 tokens per word with the test tokenizer)."""
    user_words: int = 50
    """Each new user message."""
    reply_words: int = 50
    """Each assistant reply kept in the history."""
    output_tokens: int = 16
    """Tokens the engine generates per request."""
    seed: int = 0


#: The shape of a trace a benchmark script takes from its command line.
SHAPE = ("users", "turns", "system_words", "user_words", "reply_words", "output_tokens")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--users``, ``--turns``, ... (:data:`SHAPE`), defaulting to the note's trace."""
    default = TraceSpec()
    for name in SHAPE:
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(default, name))


def from_arguments(a: argparse.Namespace, seed: int) -> TraceSpec:
    """The trace :func:`add_arguments`' options describe, generated from ``seed``."""
    return TraceSpec(**{name: getattr(a, name) for name in SHAPE}, seed=seed)


@dataclass(frozen=True)
class Turn:
    user: int
    turn: int
    prompt: str
    output_tokens: int


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 9))) for _ in range(n))


def generate(spec: TraceSpec) -> list[Turn]:
    """The trace in arrival order; the same spec gives the same text."""
    if spec.users < 1 or spec.turns < 1:
        raise ValueError("a trace needs at least one user and one turn")
    rng = random.Random(spec.seed)
    system = _words(rng, spec.system_words)
    history = [system] * spec.users
    out: list[Turn] = []
    for t in range(spec.turns):
        for u in range(spec.users):
            history[u] = f"{history[u]} {_words(rng, spec.user_words)}"
            out.append(Turn(u, t, history[u], spec.output_tokens))
        for u in range(spec.users):
            history[u] = f"{history[u]} {_words(rng, spec.reply_words)}"
    return out


def write_trace(turns: Iterable[Turn], path: Path, spec: TraceSpec | None = None) -> Path:
    """Writes vLLM's ``custom`` dataset JSONL (and ``PATH.spec.json`` if given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for t in turns:
            f.write(json.dumps({"prompt": t.prompt, "output_tokens": t.output_tokens, "user": t.user,
                                "turn": t.turn}) + "\n")
    if spec is not None:
        path.with_suffix(".spec.json").write_text(json.dumps(asdict(spec), indent=1) + "\n")
    return path


def read_trace(path: Path) -> list[Turn]:
    turns = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            turns.append(Turn(d["user"], d["turn"], d["prompt"], d["output_tokens"]))
    return turns


def infinite_cache_hits(prompts: Sequence[Sequence[int]], block_size: int) -> list[int]:
    """Per request, the prompt tokens a cache that never evicts would serve:
    the leading full blocks some earlier prompt of the trace also began with,
    less the last token, which an engine always computes (vLLM does)."""
    seen: set[bytes] = set()
    hits = []
    for toks in prompts:
        chain = _chain(toks, block_size)
        n = 0
        while n < len(chain) and chain[n] in seen:
            n += 1
        hits.append(min(n * block_size, max(0, ((len(toks) - 1) // block_size) * block_size)))
        seen.update(chain)
    return hits


def _chain(toks: Sequence[int], block_size: int) -> list[bytes]:
    out = []
    h = hashlib.sha256()
    for i in range(len(toks) // block_size):
        h.update(json.dumps(list(toks[i * block_size:(i + 1) * block_size])).encode())
        out.append(h.copy().digest())
    return out


def token_counts(turns: Sequence[Turn], tokenize: Callable[[str], list[int]], block_size: int) -> dict[str, Any]:
    """The trace's sizes and its infinite-cache bound, for the record."""
    toks = [tokenize(t.prompt) for t in turns]
    hits = infinite_cache_hits(toks, block_size)
    total = sum(len(t) for t in toks)
    return {
        "requests": len(turns),
        "prompt_tokens": total,
        "prompt_tokens_max": max(len(t) for t in toks),
        "prompt_tokens_mean": total / len(toks),
        "infinite_cache_hit_tokens": sum(hits),
        "infinite_cache_hit_rate": sum(hits) / total if total else 0.0,
    }
