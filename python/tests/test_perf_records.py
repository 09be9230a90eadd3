"""The measurement records and notes stay readable by a newcomer (perf/README.md):

* every perf record under notes/ carries the header (date, commit, dirty,
  machine, command, versions), so a record written without perf's header
  fails here;
* every note says its status on a line at its top and is listed, with that
  status, in notes/README.md;
* README's headline table is what ``python3 -m perf.headlines`` generates
  from the records;
* the library's pieces a record depends on behave as documented.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from perf import HEADER_KEYS, Sampler, header, headlines, median, median_or_none, record, summarize  # noqa: E402
from perf.records import header_problems, load, record_paths  # noqa: E402

RECORDS = record_paths()
NOTES = sorted((REPO_ROOT / "notes").glob("[0-9][0-9][0-9]-*.md"))
INDEX = (REPO_ROOT / "notes" / "README.md").read_text()
#: "Status: current", "Status: open (...)", "Status: superseded [in part] by 026 [and 039] (...)".
STATUS = re.compile(r"^Status: (current|open|superseded (?:in part )?by \d{3}(?:,? (?:and )?\d{3})*)(?: \(.*\))?(?:;.*)?$")


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


def test_a_median_skips_repeats_that_measured_nothing_and_refuses_none_at_all():
    assert median([3.0, None, 1.0, 2.0]) == 2.0 and median_or_none([None, 5.0]) == 5.0
    assert median_or_none([]) is None and median_or_none([None]) is None
    with pytest.raises(ValueError, match="no measured values"):
        median([None])


def test_the_sampler_reads_cpu_time_and_rss_from_proc():
    with Sampler(os.getpid(), 0.01) as s:
        x = 0
        for i in range(2_000_000):
            x += i
    r = s.result()
    assert r["rss_peak_mib"] >= r["rss_before_mib"] > 0
    assert r["cpu_s"] > 0


def _status(path: Path) -> str:
    head = path.read_text().splitlines()[:8]
    found = [m.group(1) for m in map(STATUS.match, head) if m]
    assert found, (f"{path.name}: no 'Status: current|open|superseded by NNN' line among its first lines "
                   "(notes/README.md says what each means)")
    return found[0]


@pytest.mark.parametrize("path", NOTES, ids=[p.name for p in NOTES])
def test_every_note_has_a_status_line_and_is_in_the_index(path: Path):
    status = _status(path)
    for n in re.findall(r"\d{3}", status):
        assert list((REPO_ROOT / "notes").glob(f"{n}-*.md")), f"{path.name} is superseded by {n}, which does not exist"
    row = next((line for line in INDEX.splitlines() if line.startswith(f"| [`{path.stem}`]({path.name})")), None)
    assert row, f"notes/README.md does not list {path.name} (a row starting | [`{path.stem}`]({path.name}))"
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    listed = re.sub(r"\[(\d{3})\]\([^)]*\)", r"\1", cells[2])
    assert listed == status, f"notes/README.md lists {path.name} as {listed!r}, the note says {status!r}"


def test_readme_headlines_are_generated_from_the_records():
    text = (REPO_ROOT / "README.md").read_text()
    assert headlines.splice(text, headlines.table()) == text, (
        "README.md's headline block differs from the records: run `python3 -m perf.headlines`")


def test_combine_keeps_every_part_and_takes_the_header_from_them(tmp_path):
    from perf.combine import combine

    a = record({"x": 1}, {**header(command="a.py"), "date": "2026-12-01T00:00:00+00:00", "dirty": False})
    b = record({"y": 2}, {**header(command="b.py"), "date": "2026-12-02T00:00:00+00:00", "dirty": True})
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    rec = combine(tmp_path / "out.json", [tmp_path / "p" / "a.json", tmp_path / "b.json"])
    assert not list(header_problems(rec))
    assert rec["date"] == b["date"] and rec["dirty"] is True
    assert rec["command"] == "a.py && b.py"
    assert rec["parts"]["p/a.json"]["x"] == 1 and rec["parts"]["b.json"]["y"] == 2
