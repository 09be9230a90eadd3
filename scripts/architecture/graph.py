"""Circles in a module dependency graph, for the Rust and the Python rules.

A circle is a strongly connected component of more than one module: each of
its modules reaches every other through imports, so none can be read, tested
or replaced without the rest (docs/architecture.md, "Checked shape").
"""
from __future__ import annotations

from collections.abc import Mapping, Set


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each
    sorted, in a stable order. Edges to modules outside `graph` are ignored."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)
