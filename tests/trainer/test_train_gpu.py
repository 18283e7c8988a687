"""GPU: the same tiny GRPO run with the fast engine in bf16 (skipped without CUDA)."""

from __future__ import annotations

import json

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
    """trainer.tf32 / trainer.compile are applied in setup (and said so in train.log)."""
    path = make_config(
        tmp_path,
        tiny_model_dir,
        model={"device": "cuda", "torch_dtype": "float32"},
        trainer={"tf32": True, "compile": True},
    )
    cfg, base = load_config(path)
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()
    fit(cfg, base)
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert "TF32 matmuls on" in log and "policy forward compiled" in log
    # the training forward ran through a compiled graph (not a wrapper nobody calls)
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1
    assert torch.get_float32_matmul_precision() == "high"
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(x["loss"] == x["loss"] for x in lines)  # finite, not NaN
