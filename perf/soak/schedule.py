"""The soak's seeded fault schedule, and the windows it cuts the run into.

The schedule scales with the run's length: a warm-up, then slots of about
``SLOT_TARGET_S`` seconds (at least five, so every fault kind fits in even a
two-minute run), each a fault followed by a fault-free baseline. Kinds come
in rounds: every round is the five kinds in a seeded order, so any run with
five slots or more has every kind at least once (docs/durability.md, "A soak
with faults").
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FAULT_KINDS", "MIN_DURATION_S", "Fault", "Window", "plan", "summarize_window", "percentile"]

#: Every fault the soak injects (names fixed: soak.json and the test use them).
FAULT_KINDS = ("kill_restart", "store_stop", "disk_full", "partition", "stall_client")

#: Target slot length of a long run (fault + the baseline after it).
SLOT_TARGET_S = 40.0
#: Shortest fault: a stalled client must outlast server.read_timeout (4 s in the soak's config).
MIN_FAULT_S = 8.0
#: Shortest fault-free baseline after a fault.
MIN_BASELINE_S = 4.0
#: Fault-free time after the last slot, before the load stops.
TAIL_S = 5.0
#: Below this, five slots do not fit.
MIN_DURATION_S = 75.0


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``kind`` from ``start_s`` (seconds after the load
    started) for ``length_s``."""

    index: int
    kind: str
    start_s: float
    length_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def warmup_s(duration: float) -> float:
    """Fault-free time at the start: 8 % of the run, 5 to 15 s."""
    return max(5.0, min(15.0, 0.08 * duration))


def plan(duration: float, seed: int) -> list[Fault]:
    """The faults of a run of ``duration`` seconds, the same for the same seed."""
    if duration < MIN_DURATION_S:
        raise ValueError(f"--duration {duration:g} is too short: every fault kind needs {MIN_DURATION_S:g} s or more")
    rng = random.Random(seed)
    start = warmup_s(duration)
    room = duration - start - TAIL_S
    n = max(len(FAULT_KINDS), int(room // SLOT_TARGET_S))
    slot = room / n
    if slot < MIN_FAULT_S + MIN_BASELINE_S:
        raise ValueError(f"--duration {duration:g}: {n} slots of {slot:.1f} s leave no room for a fault and a baseline")
    kinds: list[str] = []
    while len(kinds) < n:
        round_ = list(FAULT_KINDS)
        rng.shuffle(round_)
        kinds += round_
    faults = []
    for i, kind in enumerate(kinds[:n]):
        length = min(max(MIN_FAULT_S, rng.uniform(0.40, 0.55) * slot), slot - MIN_BASELINE_S)
        jitter = rng.uniform(0.0, max(0.0, slot - length - MIN_BASELINE_S) / 2)
        faults.append(Fault(i + 1, kind, round(start + i * slot + jitter, 3), round(length, 3)))
    return faults


@dataclass
class Window:
    """A stretch of the run: ``baseline`` (no fault) or a fault's kind, with
    the times it actually began and ended (seconds after the load started)."""

    name: str
    kind: str
    start_s: float
    end_s: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank, ``None`` for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def summarize_window(w: Window, ops: list[tuple[float, float, str, str]]) -> dict[str, Any]:
    """A window's row of soak.json from its ops: ``(scheduled_s, latency_s,
    op, outcome)``, outcome ``ok``, ``miss`` (answered, fewer blocks than
    asked), ``refused`` (an error status from the server), ``deadline``
    (past the client's deadline) or ``error`` (anything else)."""
    lat = [x[1] for x in ops]
    errors = [x for x in ops if x[3] in ("refused", "deadline", "error")]
    row: dict[str, Any] = {
        "name": w.name, "kind": w.kind, "start_s": round(w.start_s, 3),
        "end_s": round(w.end_s, 3) if w.end_s is not None else None,
        "ops": len(ops), "errors": len(errors),
        "error_rate": round(len(errors) / len(ops), 4) if ops else None,
        "refused_writes": sum(1 for x in ops if x[2] == "write" and x[3] != "ok"),
        "deadline_exceeded": sum(1 for x in ops if x[3] == "deadline"),
        "misses": sum(1 for x in ops if x[3] == "miss"),
        "p50_ms": _ms(percentile(lat, 0.50)), "p99_ms": _ms(percentile(lat, 0.99)),
        "max_ms": _ms(max(lat) if lat else None),
    }
    by_op = {}
    for op in ("lookup", "read", "write"):
        mine = [x for x in ops if x[2] == op]
        bad = sum(1 for x in mine if x[3] in ("refused", "deadline", "error"))
        by_op[op] = {"ops": len(mine), "errors": bad, "p99_ms": _ms(percentile([x[1] for x in mine], 0.99))}
    row["by_op"] = by_op
    return row


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 2)
