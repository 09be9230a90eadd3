"""The soak (``scripts/soak.py``): mixed load from several clients against
one kvtier server on memory + disk + object store, under a seeded schedule of
faults. This package holds its parts that do not drive the SDK: the ledger
and its verdict (:mod:`perf.soak.checker`), the schedule and the per-window
summaries (:mod:`perf.soak.schedule`), and the injectors that are not a
signal to a process (:mod:`perf.soak.faults`). docs/durability.md, "A soak
with faults", describes the run."""
from __future__ import annotations
