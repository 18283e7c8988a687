"""python -m bench rollout on CPU with a tiny shape: each side in its own process, one JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_rollout_sides_in_fresh_processes_one_json(tmp_path):
    cmd = [sys.executable, "-m", "bench", "rollout", "--out-dir", str(tmp_path), "--name", "r"]
    cmd += ["--shape", "tiny", "--prompts", "4", "--new-tokens", "8"]
    cmd += ["--prompt-len", "8", "--sides", "fast,hf-dynamic", "--lora"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    res = json.loads((tmp_path / "r.json").read_text())
    fast, hf = res["sides"]["fast"], res["sides"]["hf-dynamic"]
    assert "error" not in fast and "error" not in hf, res
    assert fast["tokens"] == hf["tokens"] == 4 * 8
    ratio = res["fast_over_hf_dynamic"]  # both sides of the ratio are recorded
    assert ratio["ratio"] == ratio["fast_tok_s"] / ratio["hf_dynamic_tok_s"]
    assert res["fast_lora_over_hf_dynamic"]["fast_lora_tok_s"] == fast["lora_tok_s"]
    assert fast["lora_logprob_mean_abs_diff"] < 1e-3  # fp32 on CPU: engine == training forward
    assert fast["lora_base_logprob_mean_abs_diff"] < 1e-3  # lora_compute="base" (fp32 here)
    assert fast["lora_merge_logprob_mean_abs_diff"] < 1e-3  # lora_compute="merge" (fp32 here)
    assert (
        res["fast_lora_merge_over_hf_dynamic"]["fast_lora_merge_tok_s"] == fast["lora_merge_tok_s"]
    )
    assert 0.0 <= res["greedy_token_agreement"] <= 1.0
    assert res["environment"]["torch"] and "greedy_tokens" not in fast
