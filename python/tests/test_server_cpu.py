"""scripts/bench-server-cpu.py's selection (notes/046): which measured steps
may stand in a ratio of server CPU per operation, and the ratios made from
them. Pure functions on made-up rows: no servers, fast."""
from __future__ import annotations

from typing import Any

from conftest import load_script

m = load_script("bench-server-cpu.py", "bench_server_cpu")


def row(system: str, cpu_us: float, busy: float, op: str = "read", c: int = 8, errors: int = 0,
        ops: int = 1000, gen: float = 0.5) -> dict[str, Any]:
    return {"system": system, "op": op, "concurrency": c, "ops": ops, "errors": errors, "busy_share": busy,
            "server_cpu_us_per_op": cpu_us, "throughput_ops_s": 1000.0, "p99_us": 5000.0,
            "generator_core_share": gen}


def test_a_step_below_the_busy_threshold_or_with_errors_is_excluded() -> None:
    assert m.exclusions(row("kvtier", 300, 0.5), 0.2) == []
    assert m.exclusions(row("kvtier", 300, 0.19), 0.2) == ["server core 19% busy < 20%"]
    assert m.exclusions(row("kvtier", 300, 0.5, errors=3), 0.2) == ["3 errors"]
    assert "no operation answered" in m.exclusions(row("kvtier", 0, 0.5, ops=0), 0.2)


def test_a_cell_is_used_when_most_repeats_are_and_takes_their_median() -> None:
    rows = [row("kvtier", 300, 0.5), row("kvtier", 330, 0.6), row("kvtier", 900, 0.1)]
    x = m.cell(rows, 0.2)
    assert x["used"] and x["usable_repeats"] == 2
    # The median of the two usable repeats, not of all three (which would be 330).
    assert x["server_cpu_us_per_op"]["median"] == 315
    # The spread shows every repeat, the excluded one too.
    assert x["server_cpu_us_per_op"]["max"] == 900
    assert x["ops_per_server_cpu_s"] == 1e6 / 315
    assert x["excluded"] == ["server core 10% busy < 20%"]

    half = m.cell([row("redis", 300, 0.5), row("redis", 310, 0.1)], 0.2)
    assert not half["used"]


def test_the_generator_is_saturated_at_ninety_percent_of_its_core() -> None:
    assert m.cell([row("mooncake", 500, 0.3, gen=0.95)], 0.2)["generator_saturated"]
    assert not m.cell([row("mooncake", 500, 0.3, gen=0.85)], 0.2)["generator_saturated"]


def test_ratios_only_between_used_cells_and_against_the_redis_target() -> None:
    rows = [row("kvtier", 200, 0.5), row("redis", 250, 0.5), row("mooncake", 400, 0.1),
            row("kvtier", 300, 0.5, op="write"), row("redis", 280, 0.5, op="write")]
    got = {(r["op"], r["peer"]): r for r in m.ratios(m.summarize_cells(rows, 0.2))}
    read = got[("read", "redis")]
    assert read["cpu_ratio"] == 0.8 and read["target"] == 0.83 and read["meets_target"] is True
    assert read["paired"]["repeats"] == [0.8]
    write = got[("write", "redis")]
    assert write["target"] == 1.0 and write["meets_target"] is False
    idle = got[("read", "mooncake")]
    assert idle["cpu_ratio"] is None and idle["paired"] is None and "target" not in idle
    assert idle["why_not"] == ["mooncake: server core 10% busy < 20%"]


def test_repeat_by_repeat_ratios_pair_only_usable_repeats() -> None:
    rows = [row("kvtier", 200, 0.5), row("kvtier", 400, 0.5), row("kvtier", 300, 0.5),
            row("redis", 250, 0.5), row("redis", 400, 0.1), row("redis", 200, 0.5)]
    r = next(x for x in m.ratios(m.summarize_cells(rows, 0.2)) if x["peer"] == "redis")
    # Repeat 2 is not usable on Redis's side: only repeats 1 and 3 pair.
    assert r["paired"]["repeats"] == [0.8, 1.5]
    assert r["paired"]["median"] == 1.15
