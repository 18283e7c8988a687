"""GPU: the same tiny GRPO run with the fast engine in bf16 (skipped without CUDA)."""

from __future__ import annotations

import json

import pytest
import torch

from danka.config import load_config
from danka.trainer.fit import fit

from .conftest import make_config

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_grpo_on_gpu_bf16(tmp_path, tiny_model_dir, engine):
    path = make_config(
        tmp_path,
        tiny_model_dir,
        model={
            "actor_model_name_or_path": str(tiny_model_dir),
            "device": "cuda",
            "torch_dtype": "bfloat16",
        },
        rollout={"engine": engine},
    )
    cfg, base = load_config(path)
    fit(cfg, base)
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(x["loss"] is not None for x in lines)
    if engine == "fast":  # the engine reports its own log-probs: compare with the training forward
        assert all(x["rollout/logprob_gap"] < 0.1 for x in lines)
