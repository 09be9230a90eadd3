"""scripts/bench-codecs.py (notes/063) on tiny sizes with a debug build: it
builds and runs the codec bench, and writes a record with the common header
and one row per codec and variant. The numbers of a debug build mean
nothing; the run does."""
from __future__ import annotations

import json
import subprocess
import sys

from kvtier.server import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "bench-codecs.py"


def test_the_codec_bench_runs_and_writes_its_record(tmp_path):
    out = tmp_path / "codecs.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--debug", "--blocks", "3", "--block-mib", "0.25",
         "--threads", "2"],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    rec = json.loads(out.read_text())
    assert list(rec)[:6] == ["date", "commit", "dirty", "machine", "command", "versions"], list(rec)[:6]
    assert rec["build"] == "debug"
    r = rec["results"]
    assert (r["blocks"], r["block_bytes"], r["threads"]) == (3, 1 << 18, 2)
    rows = {row["codec"]: row for row in r["codecs"]}
    assert {"zstd-planes", "lz4-planes", "fp8-e4m3"} <= {k for k, v in rows.items() if v["shipped"]}
    assert "zstd-1 (no planes)" in rows
    for name, row in rows.items():
        # LZ4 without planes finds nothing in bf16 (its framing costs ~0.4 %).
        assert row["ratio"] > (1.0 if row["shipped"] else 0.95), name
        for k in ("encode_gbps_1core", "decode_gbps_1core", "encode_gbps_all", "decode_gbps_all"):
            assert row[k] > 0, (name, k)
    # Lossy: within half an E4M3 step at the top of the range (16 scale units)
    # plus the bf16 rounding of the result (< 1.75); a 2x ratio less the scales.
    fp8 = rows["fp8-e4m3"]
    assert fp8["error"]["max_err_in_scale_units"] <= 17.75
    assert 1.95 < fp8["ratio"] <= 2.0
    assert rows["zstd-planes"]["error"] is None
