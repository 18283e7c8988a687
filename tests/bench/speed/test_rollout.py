"""python -m bench rollout on CPU with a tiny shape: each side in its own process, one JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


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


@pytest.mark.slow
def test_real_shape_path_gsm8k_prompts_eos_both_default_engine(tmp_path):
    from danka.models.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    rows = tmp_path / "g.jsonl"
    rows.write_text("".join(json.dumps({"question": f"What is {i} + 3?",
                    "answer": f"#### {i + 3}"}) + "\n" for i in range(3)))  # fmt: skip
    cmd = [sys.executable, "-m", "bench", "rollout", "--out-dir", str(tmp_path), "--name", "r"]
    cmd += ["--model", str(model), "--prompts-from", str(rows), "--prompts", "4"]
    cmd += ["--new-tokens", "8", "--eos", "both", "--lora", "--lora-modes", "auto"]
    cmd += ["--lora-rank", "8", "--sides", "fast-default,hf-dynamic", "--check-rows", "2"]
    cmd += ["--device", "cpu"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
    res = json.loads((tmp_path / "r.json").read_text())
    fast, hf = res["sides"]["fast-default"], res["sides"]["hf-dynamic"]
    assert "error" not in fast and "error" not in hf, res
    # 4 prompts from 3 rows (repeated), rendered with the chat template + the instruction
    assert fast["prompt_tokens"] == hf["prompt_tokens"] and fast["prompt_tokens"]["min"] > 60
    assert fast["tokens"] == fast["lora_auto_tokens"] == 4 * 8  # EOS off: equal work
    assert 4 <= fast["eos_lora_auto_tokens"] <= 4 * 8 and 4 <= hf["eos_tokens"] <= 4 * 8
    on = res["fast_default_eos_lora_auto_over_hf_dynamic"]  # EOS on against HF's EOS on
    assert on["hf_dynamic_tok_s"] == hf["eos_tok_s"]
    assert fast["lora_auto_logprob_mean_abs_diff"] < 1e-3  # fp32 on CPU
    assert res["goals"]["variant"] == "lora_auto" and "eos_on" in res["goals"]
    assert "partial" not in res


def test_generated_tokens_stop_at_the_first_end_token():
    from bench.speed.rollout_real import generated_tokens

    ids = torch.tensor([[5, 9, 2, 9], [5, 5, 5, 5], [9, 0, 0, 0]])
    assert generated_tokens(ids, [9]) == 2 + 4 + 1
    assert generated_tokens(ids, []) == 12
