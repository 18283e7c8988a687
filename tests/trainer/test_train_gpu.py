"""GPU: the same tiny GRPO run with the fast engine in bf16 (skipped without CUDA)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from danka.config import load_config
from danka.trainer.fit import fit

from .conftest import make_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
BF16 = {"device": "cuda", "torch_dtype": "bfloat16"}


def _fit(tmp_path, model_dir, reward: str | None = None, **sections) -> list[dict]:
    """Train the tiny config with ``sections`` (and ``reward`` as reward.py); the metrics."""
    path = make_config(tmp_path, model_dir, **sections)
    if reward is not None:
        (tmp_path / "reward.py").write_text(reward)
    cfg, base = load_config(path)
    fit(cfg, base)
    return [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_grpo_on_gpu_bf16(tmp_path, tiny_model_dir, engine):
    lines = _fit(tmp_path, tiny_model_dir, model=BF16, rollout={"engine": engine})
    assert len(lines) == 2 and all(x["loss"] is not None for x in lines)
    if engine == "fast":  # the engine reports its own log-probs: compare with the training forward
        assert all(x["rollout/logprob_gap"] < 0.1 for x in lines)


@pytest.mark.parametrize("lora_compute", ["adapter", "base", "merge"])
def test_grpo_on_gpu_bf16_with_each_lora_compute(tmp_path, tiny_model_dir, lora_compute):
    """rollout.lora_compute reaches the fast engine; the sampled log-probs stay within
    bf16 noise of the training forward (the engine reports its own)."""
    lines = _fit(tmp_path, tiny_model_dir, model=BF16,
                 rollout={"engine": "fast", "lora_compute": lora_compute})  # fmt: skip
    assert len(lines) == 2 and all(x["rollout/logprob_gap"] < 0.1 for x in lines)
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert "rollout.engine: fast" in log


@pytest.mark.parametrize("mode", ["token_tis", "seq_mask"])
def test_rollout_correction_on_gpu_bf16(tmp_path, tiny_model_dir, mode):
    # issue 11 #3: bf16 fast-engine samples vs the training forward; ratios measured and used
    lines = _fit(tmp_path, tiny_model_dir, model=BF16, rollout={"engine": "fast"},
                 trainer={"rollout_correction": {"mode": mode}})  # fmt: skip
    for m in lines:
        assert 0.5 < m["rollout_is/mean"] < 2.0 and m["rollout_is/max"] >= m["rollout_is/mean"]
        assert m["skipped_step"] == 0.0
        assert "memory/rollout_peak_gib" in m and "time/logprobs" in m


def test_ppo_on_gpu_bf16_zero_rewards_keeps_the_policy(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    zero = "def reward(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    _fit(tmp_path, tiny_model_dir, reward=zero, model=BF16,
         trainer={"algorithm": "ppo", "samples_per_prompt": 1, "micro_batch_size": 2})  # fmt: skip
    adapter = load_file(tmp_path / "out" / "actor" / "checkpoint_2" / "adapter_model.safetensors")
    assert all((v == 0).all() for k, v in adapter.items() if "lora_B" in k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tf32_and_compile_on_gpu(tmp_path, tiny_model_dir):
    """speed.tf32 / speed.compile are applied in setup (and said so in train.log)."""
    path = make_config(
        tmp_path,
        tiny_model_dir,
        model={"device": "cuda", "torch_dtype": "float32"},
        speed={"tf32": True, "compile": True},
    )
    cfg, base = load_config(path)
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()
    fit(cfg, base)
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert "TF32 matmuls on" in log
    assert "speed.compile: the training forwards' decoder layers compiled" in log
    # the training forward ran through a compiled graph (not a wrapper nobody calls)
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1
    assert torch.get_float32_matmul_precision() == "high"
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(x["loss"] == x["loss"] for x in lines)  # finite, not NaN


def _real_oom_above(limit: int):
    """A wrapper that asks the CUDA allocator for 4x the card's memory whenever the
    micro-batch is above ``limit``: a real ``torch.OutOfMemoryError`` from the device."""
    too_much = 4 * torch.cuda.get_device_properties(0).total_memory

    def inject(micro: int) -> None:
        if micro > limit:
            torch.empty(too_much, dtype=torch.uint8, device="cuda")

    return inject


def test_a_real_cuda_oom_in_the_update_halves_the_micro_batch_with_the_same_loss(
    tmp_path, tiny_model_dir, monkeypatch
):
    """An allocation the card cannot hold inside the update at micro-batch 4: the update
    runs again at 2, the step is not skipped, and the loss equals an untroubled run's
    (fp32 on the GPU; losses are normalised by the step's token counts)."""
    import danka.step.update as upd

    fp32 = {"device": "cuda", "torch_dtype": "float32"}
    for side in ("clean", "oom"):
        (tmp_path / side).mkdir()
    clean = _fit(tmp_path / "clean", tiny_model_dir, model=fp32, trainer={"total_steps": 1})
    real, inject, calls = upd.actor_minibatch, _real_oom_above(2), []

    def flaky(models, algo, opt, mini, settings, micro_size, *rest):
        calls.append(micro_size)
        inject(micro_size)
        return real(models, algo, opt, mini, settings, micro_size, *rest)

    monkeypatch.setattr(upd, "actor_minibatch", flaky)
    got = _fit(tmp_path / "oom", tiny_model_dir, model=fp32, trainer={"total_steps": 1})
    assert calls[:2] == [4, 2]
    log = (tmp_path / "oom" / "out" / "logs" / "train.log").read_text()
    assert "out of memory in the update: micro_batch_size 4 -> 2 (kept for" in log
    assert got[0]["skipped_step"] == 0.0
    assert got[0]["loss"] == pytest.approx(clean[0]["loss"], rel=1e-4, abs=1e-6)


def test_a_real_cuda_oom_in_the_fast_rollout_halves_the_generation_batch(
    tmp_path, tiny_model_dir, monkeypatch
):
    """The fast engine's generate call at more than 4 sequences meets a real CUDA OOM:
    the rollout runs again in halves and both steps train."""
    from danka.rollout.fast.engine import FastEngine

    inject = _real_oom_above(4)
    real = FastEngine._run  # one decode batch (sample() splits the prompts into them)

    def flaky(self, root, w, prompts, params, *rest):
        if params.n > 1:  # the training rollout (evaluation is greedy, n = 1)
            inject(len(prompts) * params.n)
        return real(self, root, w, prompts, params, *rest)

    monkeypatch.setattr(FastEngine, "_run", flaky)
    lines = _fit(tmp_path, tiny_model_dir, model=BF16, rollout={"engine": "fast"})
    assert len(lines) == 2 and all(x["skipped_step"] == 0.0 for x in lines)
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert log.count("out of memory in the rollout: sequences per generate call 8 -> 4") == 1


def test_gpu_memory_caps_the_process_and_plans_the_micro_batch_in_it(tmp_path, tiny_model_dir):
    """speed.gpu_memory on a bare ``cuda`` device: the process is capped (a larger
    allocation fails inside the cap) and micro_batch_size: auto is planned in it."""
    try:
        lines = _fit(tmp_path, tiny_model_dir, model={"device": "cuda"},
                     speed={"gpu_memory": "2GiB"}, trainer={"micro_batch_size": "auto"})  # fmt: skip
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert "speed.gpu_memory: this process is capped at 2GiB of" in log
    # e.g. "trainer.micro_batch_size, speed.logprob_chunk_size: auto -> micro-batch 8, ..."
    assert re.search(r"trainer\.micro_batch_size(, [a-z_.]+)*: auto -> micro-batch \d+", log)
    assert len(lines) == 2
