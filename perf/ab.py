"""Alternating repeats, medians, and outliers shown rather than hidden.

On a shared machine a slow phase can last tens of seconds. Running the
variants A B, B A, A B, ... puts such a phase on both sides; comparing the
medians of their repeats keeps one bad repeat from moving the result; and a
repeat outside 0.75-1.33x its median is listed next to the result
(docs/bench.md, "Comparisons", rule 4), never silently dropped.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: A repeat below LOW or above HIGH times its median is an outlier.
LOW, HIGH = 0.75, 1.33


def median_or_none(xs: Sequence[float | None]) -> float | None:
    """The median of the values present (a repeat that measured nothing is
    None); None when none is."""
    present = [x for x in xs if x is not None]
    return statistics.median(present) if present else None


def median(xs: Sequence[float | None]) -> float:
    """:func:`median_or_none` for a value the caller computes with: an error
    names the empty measurement instead of a TypeError further on."""
    m = median_or_none(xs)
    if m is None:
        raise ValueError("no measured values to take the median of")
    return m


def order(variants: Sequence[str], repeat: int) -> list[str]:
    """Repeat ``repeat``'s order: the variants as given on even repeats,
    reversed on odd ones (A B, B A, ...)."""
    return list(variants) if repeat % 2 == 0 else list(reversed(variants))


def alternate(variants: Sequence[str], repeats: int, run: Callable[[str, int], T],
              log: Callable[[str], None] | None = print) -> dict[str, list[T]]:
    """Calls ``run(variant, repeat)`` ``repeats`` times per variant in
    :func:`order`; returns each variant's results in repeat order."""
    out: dict[str, list[T]] = {v: [] for v in variants}
    for r in range(repeats):
        for v in order(variants, r):
            if log:
                log(f"repeat {r}: {v}")
            out[v].append(run(v, r))
    return out


@dataclass
class Summary:
    """A variant's repeats: their median and the ones outside LOW-HIGH x it."""

    values: list[float]
    median: float
    #: (repeat index, value, value / median) of each outlier.
    outliers: list[tuple[int, float, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "repeats": self.values,
            "outliers": [{"repeat": i, "value": v, "over_median": round(q, 3)} for i, v, q in self.outliers],
        }

    def describe(self, name: str = "", unit: str = "") -> str:
        """``name`` plus one line per outlier, as a note's table prints them."""
        return "; ".join(f"{name} repeat {i + 1}: {v:.1f}{unit} is {q:.2f}x the median {self.median:.1f}".strip()
                         for i, v, q in self.outliers)


def summarize(values: Sequence[float], low: float = LOW, high: float = HIGH) -> Summary:
    """The median of ``values`` and the repeats outside ``low``-``high`` x it."""
    if not values:
        raise ValueError("no repeats to summarise")
    vals = [float(v) for v in values]
    med = statistics.median(vals)
    outliers = []
    if med:
        outliers = [(i, v, v / med) for i, v in enumerate(vals) if not low <= v / med <= high]
    return Summary(vals, med, outliers)


def ratio(base: Sequence[float], head: Sequence[float]) -> dict[str, Any]:
    """head / base of the medians, with both sides' summaries (outliers shown)."""
    b, h = summarize(base), summarize(head)
    return {
        "ratio": h.median / b.median if b.median else None,
        "base": b.as_dict(),
        "head": h.as_dict(),
    }
