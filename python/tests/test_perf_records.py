"""The measurement records and notes stay readable by a newcomer (perf/README.md):

* every perf record under notes/ carries the header (date, commit, dirty,
  machine, command, versions), so a record written without perf's header
  fails here;
* the library's pieces a record depends on behave as documented.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from perf import HEADER_KEYS, Sampler, header, record, summarize  # noqa: E402
from perf.records import header_problems, load, record_paths  # noqa: E402

RECORDS = record_paths()


def test_records_are_found():
    assert len(RECORDS) >= 90, "notes/ holds at least the 91 records converted with perf/migrate.py"


@pytest.mark.parametrize("path", RECORDS, ids=[str(p.relative_to(REPO_ROOT)) for p in RECORDS])
def test_every_record_carries_the_header(path: Path):
    rec = load(path)
    problems = list(header_problems(rec))
    assert not problems, (
        f"{path.relative_to(REPO_ROOT)}: {'; '.join(problems)}. Write records with perf.write_record "
        "(perf/README.md); a record from another tool goes through perf.stamp_file"
    )
    assert list(rec)[: len(HEADER_KEYS)] == list(HEADER_KEYS), "the header comes first"


def test_a_record_without_the_header_is_caught():
    assert list(header_problems({"date": "2026-11-27", "git_commit": "abc"})) == [
        "no 'commit'", "no 'dirty'", "no 'machine'", "no 'command'", "no 'versions'",
    ]
    assert "'commit' is not a commit id: 'abc123-dirty'" in header_problems(
        {**dict.fromkeys(HEADER_KEYS), "commit": "abc123-dirty"})


def test_a_new_record_has_every_header_field():
    rec = record({"results": [1]}, header(command="scripts/x.py --flag"))
    assert list(rec) == [*HEADER_KEYS, "results"]
    assert not list(header_problems(rec))
    assert rec["command"] == "scripts/x.py --flag"
    for k in ("cpu_model", "cores", "memory_gib", "kernel", "congestion_control"):
        assert k in rec["machine"]
    assert rec["versions"]["python"]
    with pytest.raises(ValueError):
        record({"commit": "mine"})


def test_outliers_are_flagged_outside_three_quarters_to_four_thirds_of_the_median():
    s = summarize([100, 74, 134, 76, 132])
    assert s.median == 100
    assert [i for i, _, _ in s.outliers] == [1, 2]


def test_the_sampler_reads_cpu_time_and_rss_from_proc():
    with Sampler(os.getpid(), 0.01) as s:
        x = 0
        for i in range(2_000_000):
            x += i
    r = s.result()
    assert r["rss_peak_mib"] >= r["rss_before_mib"] > 0
    assert r["cpu_s"] > 0
