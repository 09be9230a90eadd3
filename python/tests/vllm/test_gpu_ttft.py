"""scripts/gpu-ttft.py's CPU dry run: the GPU TTFT script runs its whole path
(prefill, save through a real kvtier, load into a fresh transformers cache,
tail forward, checks, record) on a tiny model, so a GPU machine gets a script
that works. Runs in .tools/vllm, which has torch and transformers."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.server import REPO_ROOT, find_binary

SCRIPT = REPO_ROOT / "scripts" / "gpu-ttft.py"
LENGTHS = [256, 512]
HEADER = ("date", "commit", "dirty", "machine", "command", "versions")


def dry_run(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), "--kvtier", str(find_binary()), *extra],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    log = f"exit {p.returncode}\nstdout:\n{p.stdout[-6000:]}\nstderr:\n{p.stderr[-6000:]}"
    assert (out / "record.json").is_file(), log
    return p, json.loads((out / "record.json").read_text())


def local_listen_supported() -> bool:
    h = subprocess.run([str(find_binary()), "serve", "--help"], capture_output=True, text=True, check=True)
    return "--local-listen" in h.stdout


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_dry_run_records_every_length_and_passes(tmp_path, transport):
    p, rec = dry_run(tmp_path / "out", "--transport", transport)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-6000:]
    for key in HEADER:
        assert key in rec, key
    assert {"cpu_model", "cores", "memory_gib", "kernel", "gpu"} <= set(rec["machine"])  # perf's header
    assert {"python", "torch", "transformers", "kvtier"} <= set(rec["versions"])
    version = subprocess.run([str(find_binary()), "--version"], capture_output=True, text=True, check=True).stdout
    assert rec["versions"]["kvtier"] == version.split()[-1], rec["versions"]
    assert "gpu-ttft.py" in rec["command"] and "--device cpu" in rec["command"]
    # auto takes the same-host socket where the binary has it and the SDK gets through it (one probe
    # write and read); otherwise TCP, with the reason in transport_notes.
    got = rec["transport"]
    assert got in ("local", "tcp") and rec["client_target"].startswith("unix://") == (got == "local")
    if transport == "tcp":
        assert got == "tcp" and rec["transport_notes"] == []
    elif got == "tcp":
        assert rec["transport_notes"], rec
        assert ("failed its probe" in rec["transport_notes"][0]) == local_listen_supported(), rec
    assert rec["data_plane"]
    # On the same-host socket the load is read in place (Client.map_read), else staged.
    assert rec["config"]["load"] == ("mapped" if got == "local" else "staged"), rec["config"]
    assert all(r["load_path"] == rec["config"]["load"] for r in rec["lengths"])
    assert rec["passed"] is True and all(c["ok"] for c in rec["checks"])
    assert [r["tokens"] for r in rec["lengths"]] == LENGTHS
    for r in rec["lengths"]:
        n = r["tokens"]
        assert r["cached_tokens"] == n - 1 and r["blocks_loaded"] == n // 128 == r["blocks_saved"]
        assert r["block_bytes"] == 2 * 2 * 2 * 128 * 16 * 2  # layers * K/V * kv heads * tokens * dim * bf16
        assert r["recompute"]["ttft_ms"] > 0 and len(r["recompute"]["samples_ms"]) == 3
        assert r["cached"]["ttft_ms"] > 0 and len(r["cached"]["samples"]) == 3
        assert set(r["cached"]["split_ms"]) == {"lookup", "read", "h2d", "build", "forward"}
        assert all(s["found"] == s["read"] == r["blocks_loaded"] for s in r["cached"]["samples"])
        for k in ("gbps", "read_gbps", "h2d_gbps", "h2d_floor_gbps", "vs_h2d_floor"):
            assert r["load"][k] > 0, k
        assert r["save"]["gbps"] > 0 and all(s["stored"] == n // 128 for s in r["save"]["samples"])
        assert r["bytes_equal"] is True and r["cache_equal"] is True
        lg = r["logits"]
        assert lg["ok"] is True and lg["max_abs_diff"] <= lg["tolerance"]
        # The tolerance has teeth: a load that copied nothing (an all-zero cache) would fail it.
        assert lg["zero_kv_max_abs_diff"] > lg["tolerance"], lg
        # The cached run is the tail forward over the prefill's own KV, nothing else.
        assert lg["cached_vs_control_max_abs_diff"] == 0.0, lg
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert f"Transport: **{got}**" in summary and "| 512 |" in summary


def test_a_corrupted_loaded_block_fails_the_run(tmp_path):
    """One byte of one loaded block changed: both checks must catch it and the script exits 1."""
    p, rec = dry_run(tmp_path / "out", "--corrupt-for-test", "--lengths", "256")
    assert p.returncode == 1, p.stdout[-6000:] + p.stderr[-6000:]
    assert rec["passed"] is False
    (r,) = rec["lengths"]
    assert r["bytes_equal"] is False and r["cache_equal"] is False
    assert r["logits"]["ok"] is False, r["logits"]
    failed = {c["check"] for c in rec["checks"] if not c["ok"]}
    assert failed == {"256 tokens: loaded KV bytes equal the saved bytes",
                      "256 tokens: the cache built from kvtier's blocks equals the prefill's KV",
                      "256 tokens: cached next-token logits match recompute"}, failed
    assert "FAIL" in (tmp_path / "out" / "summary.md").read_text()
