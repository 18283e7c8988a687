"""bench's packing, ppo_memory (QLoRA + danka estimate) and kernel_profile on CPU."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.lib import kernel_profile, ppo_memory
from bench.speed import packing as packing_step
from bench.speed import train


def _train(tmp_path, *args: str) -> dict:
    """``python -m bench train ARGS`` in this process; the sections of its report."""
    assert train.main([*args, "--out-dir", str(tmp_path), "--name", "b"]) == 0
    return json.loads((tmp_path / "b.json").read_text())["result"]["sections"]


def test_tiny_ppo_7b_qlora_fails_cleanly_and_every_engine_has_an_estimate(tmp_path):
    sections = _train(
        tmp_path, "--tiny", "--device", "cpu", "--only", "ppo_7b", "--ppo-engines", "hf,hf-qlora",
        "--ckpt-dir", str(tmp_path / "ckpt"),
    )  # fmt: skip
    res = sections["ppo_7b"]["results"]
    assert res["checkpoint"]["path"] == str(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()  # deleted after the (failed) load
    assert "error" not in res["engines"]["hf"]
    # bitsandbytes needs a CUDA GPU: the variant records a UserError, the others still run
    assert "load_in_4bit" in res["engines"]["hf-qlora"]["error"]
    for engine in ("hf", "hf-qlora"):
        est = res["engines"][engine]["estimate"]
        assert est["assumptions"]["rollout_engine"] == "hf"
        assert est["peak_gib"] == max(est["phases_gib"].values())
    assert res["engines"]["hf-qlora"]["estimate"]["assumptions"]["quantised_base"] == "4bit"
    assert res["engines"]["hf"]["estimate"]["assumptions"]["quantised_base"] is None


def test_estimate_comparison_hand_computed():
    est = {"phases_gib": {"rollout": 9.0, "prepare": 11.0, "update": 12.0}, "peak_gib": 12.0}
    measured = {"phase_peak_gib": {"rollout": 10.0, "logprobs": 10.0, "values": 11.0,
                                   "update": 15.0, "step": 15.0}}  # fmt: skip
    out = ppo_memory.compare(est, measured)
    assert out["rollout"]["rel_error"] == pytest.approx(-0.1)  # (9 - 10) / 10
    assert out["prepare"]["measured_gib"] == 11.0  # max of log-probs and values
    assert out["prepare"]["rel_error"] == 0.0
    assert out["step"]["rel_error"] == pytest.approx(-0.2)  # (12 - 15) / 15
    assert out["within_15pct"] is False
    assert ppo_memory.rel_error(1.0, None) is None


def test_estimate_overrides_describe_the_variant():
    over = ppo_memory.estimate_overrides("hf-qlora", 512, torch.bfloat16)
    assert over == ["rollout.engine=hf", "data.max_prompt_length=512",
                    "model.torch_dtype=bfloat16", "model.load_in_4bit=true"]  # fmt: skip
    assert ppo_memory.estimate_overrides("fast", 8, torch.float32)[0] == "rollout.engine=fast"


def test_checkpoint_dir_falls_back_when_shm_is_small(monkeypatch, tmp_path):
    args = SimpleNamespace(ckpt_dir=None)
    monkeypatch.setattr(ppo_memory.shutil, "disk_usage", lambda _: SimpleNamespace(free=2**26))
    monkeypatch.setattr(ppo_memory.tempfile, "gettempdir", lambda: str(tmp_path))
    assert ppo_memory.checkpoint_dir(args, 15 * 2**30).parent == tmp_path  # 64 MB /dev/shm
    args.ckpt_dir = "/x/y"
    assert ppo_memory.checkpoint_dir(args, 1) == Path("/x/y")


def test_gsm8k_like_batch_lengths_and_padding():
    z = SimpleNamespace(prompts=3, n=2, p=(5, 9), r=(2, 6))
    b = packing_step.gsm8k_like_batch(z, vocab=50)
    plen, rlen = b.prompt_mask.sum(1), b.response_mask.sum(1)
    assert b.size == 6 and plen.min() >= 5 and plen.max() <= 9 and rlen.max() <= 6
    assert torch.equal(plen[0::2], plen[1::2])  # a prompt's samples share its length
    assert (b.prompt_mask[:, -1] == 1).all()  # left-padded prompts
    assert (b.response_mask[:, 0] == 1).all()  # right-padded responses
    assert (b.advantages * (1 - b.response_mask)).abs().sum() == 0
    assert packing_step.parse_variant("mb16+pack+gc") == (16, True, True)
    assert packing_step.parse_variant("mb8") == (8, False, False)


def test_tiny_packing_step_runs_both_sides(tmp_path):
    sections = _train(
        tmp_path, "--tiny", "--device", "cpu", "--only", "packing_step",
        "--packing-variants", "mb8,mb8+pack",
    )  # fmt: skip
    sh = sections["packing_step"]["results"]["shapes"]["tiny"]
    off, on = sh["variants"]["mb8"], sh["variants"]["mb8+pack"]
    assert off["packing"] is False and on["packing"] is True and off["step_s"] > 0
    # 8 tiny sequences of <= 40 tokens, rows of 64: packing computes fewer pad tokens
    assert on["effective_token_ratio"] > off["effective_token_ratio"]
    ratio = sh["packed_vs_padded"]["mb8+pack"]["padded_over_packed_step_time"]
    assert ratio == pytest.approx(off["step_s"] / on["step_s"])


def test_kernel_summary_hand_computed():
    # 2 steps of 10 ms: gemm 6000 us over 4 calls, a copy 2000 us over 2 calls
    times = {"sm90_xmma_gemm_bf16": (4, 6000.0), "elementwise_copy": (2, 2000.0)}
    out = kernel_profile.summarize(times, steps=2, step_ms=10.0, top=1)
    assert out["kernel_ms_per_step"] == 4.0  # 8000 us / 2 steps
    assert out["gpu_busy_frac"] == 0.4
    assert out["kernels"] == [{"name": "sm90_xmma_gemm_bf16", "calls": 2.0, "total_ms": 3.0,
                               "pct_of_step": 30.0, "pct_of_kernels": 75.0}]  # fmt: skip
    assert out["classes"] == {"gemm": 3.0, "copy/cast/fill": 1.0}
    assert kernel_profile.kernel_class("flash_fwd_kernel") == "attention"
    assert kernel_profile.kernel_class("vectorized_elementwise_kernel") == "elementwise/other"


def test_cpu_profile_reports_ops_and_errors_are_recorded():
    x = torch.randn(64, 64)
    out = kernel_profile.top_kernels(lambda: x @ x, "cpu", steps=2, top=3)
    assert out["kind"] == "cpu_ops" and out["steps"] == 2 and len(out["kernels"]) <= 3
    assert any("mm" in k["name"] for k in out["kernels"])

    def boom():
        raise RuntimeError("no")

    assert "RuntimeError: no" in kernel_profile.profile_or_error(boom, "cpu")["error"]
