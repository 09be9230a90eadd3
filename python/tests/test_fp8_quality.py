"""scripts/fp8-quality.py's comparison (notes/065): a load engine's outputs
against the baseline's, prompt by prompt, and their summary and table.
Pure functions on made-up outputs: no engines, no servers, fast."""
from __future__ import annotations

from pathlib import Path

from conftest import load_script

m = load_script("fp8-quality.py", "fp8_quality")


def out(tokens: list[int], lps: list[dict[str, float]]) -> dict:
    return {"token_ids": tokens, "logprobs": lps, "num_cached_tokens": 0}


BASE = out([5, 6, 7], [{"5": -0.1, "9": -2.5}, {"6": -0.2, "8": -1.0}, {"7": -0.3, "1": -3.0}])


def test_identical_outputs_compare_exactly():
    r = m.compare(BASE, BASE)
    assert r["first_token_equal"] and r["full_equal"]
    assert (r["leading_equal"], r["generated"], r["same_context_steps"]) == (3, 3, 3)
    assert r["first_max_abs_dlogprob"] == r["first_mean_abs_dlogprob"] == r["same_context_max_abs_dlogprob"] == 0.0
    assert r["first_common_topk"] == 2
    assert (r["same_context_logprobs"], r["same_context_logprobs_changed"]) == (6, 0)


def test_deltas_are_over_shared_tokens_and_same_context_steps_only():
    # Step 1 picks another token: steps 0 and 1 share their context, step 2 does not
    # (its huge difference is not counted).
    got = out([5, 8, 2], [{"5": -0.15, "9": -2.3, "4": -4.0}, {"6": -1.1, "8": -0.25}, {"7": -9.0, "2": -0.1}])
    r = m.compare(BASE, got)
    assert r["first_token_equal"] and not r["full_equal"]
    assert (r["leading_equal"], r["same_context_steps"]) == (1, 2)
    assert r["first_common_topk"] == 2  # "4" is in one top-k only
    assert abs(r["first_max_abs_dlogprob"] - 0.2) < 1e-12
    assert abs(r["first_mean_abs_dlogprob"] - 0.125) < 1e-12
    assert abs(r["same_context_max_abs_dlogprob"] - 0.9) < 1e-12
    assert (r["same_context_logprobs"], r["same_context_logprobs_changed"]) == (4, 4)


def test_a_different_first_token():
    got = out([9, 6, 7], [{"5": -2.0, "9": -0.1}, {"6": -0.2}, {"7": -0.3}])
    r = m.compare(BASE, got)
    assert not r["first_token_equal"] and not r["full_equal"]
    assert (r["leading_equal"], r["same_context_steps"]) == (0, 1)
    assert abs(r["same_context_max_abs_dlogprob"] - 2.4) < 1e-12


def test_summary_margin_and_table():
    rows = [m.compare(BASE, BASE), m.compare(BASE, out([5, 8, 2], [{"5": -0.3}, {"8": -0.1}, {"2": -0.1}]))]
    s = m.summarize(rows)
    assert (s["prompts"], s["first_token_equal"], s["full_equal"], s["leading_equal"]) == (2, 2, 1, [3, 1])
    assert abs(s["first_max_abs_dlogprob"] - 0.2) < 1e-12
    assert abs(m.margin({"1": -0.5, "2": -0.1, "3": -3.0}) - 0.4) < 1e-12
    assert m.margin({"1": -0.5}) is None
    assert (s["same_context_logprobs"], s["same_context_logprobs_changed"]) == (8, 2)
    same = m.summarize([m.compare(BASE, BASE)] * 2)
    codec = {"ratio": 1.99, "load_run": {"summary": s, "per_prompt": rows, "cached_tokens": [256, 128]},
             "vs_off_load": {"summary": same}, "store_run": {"summary": same}}
    rec = {"prompts": [{"tokens": 300}, {"tokens": 200}], "generated_tokens": 3, "codecs": {"fp8-e4m3": codec},
           "baseline": {"outputs": [{"first_margin": 2.4}, {"first_margin": None}]}}
    t = m.table(rec)
    assert "| fp8-e4m3 | load vs baseline | 1.990 | 384 | 2/2 | 3, 1 | 1/2 |" in t, t
    assert "| fp8-e4m3 | load vs off's load |  | 384 | 2/2 | 3, 3 | 2/2 |" in t, t
    assert "| fp8-e4m3 | store (miss) vs baseline |  | 0 | 2/2 | 3, 3 | 2/2 |" in t, t
    assert "| 300 | 2.40e+00 | 256 / 3 / 0.00e+00 |" in t, t


def test_codec_config():
    assert "compression_namespaces" not in m.kvtier_config(Path("/s"), "off")
    fp8 = m.kvtier_config(Path("/s"), "fp8-e4m3")
    assert 'codec = "fp8-e4m3"' in fp8 and 'dtype = "bf16"' in fp8 and 'namespace = "vllm/"' in fp8
    assert "dtype" not in m.kvtier_config(Path("/s"), "zstd-planes")
