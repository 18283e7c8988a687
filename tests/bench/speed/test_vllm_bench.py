"""The vllm plumbing of the benchmarks on a CPU: the rollout side with a fake vllm, the
side skipped with its reason where vLLM cannot run, the ratios, and ``python -m bench vllm``
writing one JSON (rollout cells + GRPO steps per engine)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.speed import rollout
from bench.speed.vllm_side import vllm_skip_reason
from tests.rollout.vllm import fake_vllm

ROOT = Path(__file__).resolve().parents[3]


def test_vllm_side_runs_with_a_fake_vllm(tmp_path, monkeypatch):
    fake_vllm.install(monkeypatch)
    out = tmp_path / "side.json"
    args = rollout.parse(["--shape", "tiny", "--side", "vllm", "--prompts", "3",
                          "--new-tokens", "4", "--prompt-len", "6", "--device", "cpu",
                          "--dtype", "float32", "--agree-tokens", "3", "--eos", "on",
                          "--out", str(out)])  # fmt: skip
    rollout.one_side(args)
    res = json.loads(out.read_text())
    assert res["side"] == "vllm" and res["eos"] == "on" and res["eos_tokens"] <= 3 * 4
    assert res["eos_tok_s"] == pytest.approx(res["eos_tokens"] / res["eos_s"])
    assert res["logprob_mean_abs_diff"] < 1e-4  # fp32: the synced engine is the policy
    assert len(res["greedy_tokens"]) == 3 and len(res["greedy_tokens"][0]) <= 3
    llm = fake_vllm.LLM.instances[0]
    assert llm.kwargs["max_num_seqs"] == 3
    assert res["sleeps"] is True and llm.kwargs["enable_sleep_mode"] is True  # the default
    assert "sleep 2" in llm.loaded.calls  # each timed call woke it, sent everything, slept


def test_skip_reasons(monkeypatch):
    assert "needs a CUDA GPU" in vllm_skip_reason("cpu")
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a)
    )
    reason = vllm_skip_reason("cuda")
    assert "not installed" in reason and "danka[vllm]" in reason


def test_vllm_ratios_keep_both_sides():
    res: dict = {}
    sides = {
        "vllm": {"tok_s": 30.0, "greedy_tokens": [[1, 2, 3]]},
        "vllm-lora-merge": {"tok_s": 20.0, "eos_tok_s": 12.0},
        "fast-triton": {"tok_s": 40.0, "lora_base_tok_s": 25.0, "greedy_tokens": [[1, 2, 4]]},
        "fast-default": {"eos_lora_auto_tok_s": 16.0},
        "hf-static": {"tok_s": 10.0},
    }
    rollout.vllm_ratios(res, sides)
    assert res["vllm_over_fast_triton"] == {
        "vllm_tok_s": 30.0, "fast_triton_tok_s": 40.0, "ratio": 0.75}  # fmt: skip
    assert res["vllm_over_hf_static"]["ratio"] == 3.0
    assert res["vllm_lora_merge_over_fast_triton_lora_base"]["ratio"] == 0.8
    # against what danka train runs: the fast side's LoRA in the default (auto) mode
    assert res["vllm_lora_merge_eos_over_fast_default_eos_lora_auto"]["ratio"] == 0.75
    assert "vllm_lora_merge_over_hf_static" not in res  # HF ran the plain model only
    assert res["greedy_token_agreement_vllm_fast-triton"] == pytest.approx(2 / 3)


@pytest.mark.slow
def test_bench_vllm_one_json_with_skipped_sides(tmp_path):
    cmd = [sys.executable, "-m", "bench", "vllm", "--tiny", "--device", "cpu", "--prompts", "2",
           "--new-tokens", "4", "--eos", "off", "--sides", "vllm,fast", "--grpo-engines",
           "vllm,fast", "--grpo-steps", "2", "--out-dir", str(tmp_path), "--name", "v"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "v.json").read_text())
    cell = res["rollout"]["2x4_eos_off"]
    assert "needs a CUDA GPU" in cell["sides"]["vllm"]["skipped"]
    assert cell["sides"]["fast"]["tok_s"] > 0, cell
    assert "needs a CUDA GPU" in res["grpo"]["vllm"]["skipped"]
    fast = res["grpo"]["fast"]
    assert "error" not in fast, fast
    assert fast["median_step_s"] > 0 and len(fast["steps"]) == 2
    assert res["environment"]["torch"]
