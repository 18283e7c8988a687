"""Two gloo ranks against one process: the critic's sharding, the fast engine on gathered
weights, and batch statistics over all ranks (not per rank)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from .conftest import launch_worker

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import sys
import torch
from danka import distributed as dist
from danka.config import load_config
from danka.models.tiny import tiny_causal_lm
from danka.rollout.base import SamplingParams
from danka.rollout.fast.engine import FastEngine
from danka.rollout.fast.options import FastExperiments, FastOptions
from danka.step.model_set import build_models

dist.init(torch.device("cpu"))
cfg, _ = load_config(sys.argv[1])
models = build_models(cfg, tiny_causal_lm(), lambda: None, lambda msg: None)
out = {}
if dist.is_active():
    dist.shard_models(models)
    from torch.distributed.tensor import DTensor

    out["actor_dtensor"] = all(isinstance(p, DTensor) for p in models.actor_params)
    head = set(map(id, models.value_head.parameters()))
    adapter = [p for p in models.critic_params if id(p) not in head]
    out["critic_adapter_dtensor"] = bool(adapter) and all(isinstance(p, DTensor) for p in adapter)
    out["value_head_plain"] = not any(isinstance(p, DTensor) for p in models.value_head.parameters())
    # each optimiser param must be a live parameter of the sharded model (not a stale copy)
    live = set(map(id, models.policy.parameters())) | head
    out["critic_params_live"] = all(id(p) in live for p in models.critic_params)
# gradients on the critic's mixed parameters (sharded adapter + replicated value head):
# g = 1 for every element; the norm is sqrt(#elements) whatever the sharding, clipped to 1
for p in models.critic_params:
    p.grad = torch.ones_like(p)
out["critic_grad_norm"] = dist.clip_grad_norm(models.critic_params, 1.0)
g = models.value_head.parameters().__next__().grad
out["clipped_value_head_grad"] = float(g.flatten()[0].detach())
# the fast engine reads the parameters directly: they must be full tensors during rollout
with dist.rollout_weights(models.policy) as policy, models.actor():
    q = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    from torch.distributed.tensor import DTensor

    out["q_full_in_rollout"] = not isinstance(q, DTensor) and tuple(q.shape) == (64, 64)
    batch = FastEngine(FastOptions(), FastExperiments(use_cuda_graph=False)).generate(
        policy, [[5, 6, 7], [9, 10]], SamplingParams(n=1, temperature=0.0, max_new_tokens=6),
        eos_ids=[2], pad_id=0,
    )
out["responses"] = batch.response_ids.tolist()
# whitening over the concatenated batch: rank r holds row r of x
x = torch.tensor([[1.0, 2.0, 9.0], [4.0, -1.0, 0.0]])
mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
mine = slice(dist.rank(), dist.rank() + 1) if dist.is_active() else slice(0, 2)
out["whitened"] = dist.global_masked_whiten(x[mine], mask[mine]).tolist()
if dist.is_main():
    torch.save(out, sys.argv[2])
dist.destroy()
"""


def _run(tmp_path: Path, nproc: int) -> dict:
    out = tmp_path / f"out{nproc}.pt"
    launch_worker(tmp_path, nproc, ["config.yaml", str(out)])
    return torch.load(out, weights_only=True)


@pytest.mark.slow
def test_critic_fast_engine_and_whitening_on_two_ranks(tmp_path):
    cfg = {
        "model": {"actor_model_name_or_path": "unused", "device": "cpu"},
        "trainer": {"algorithm": "ppo", "advantage_estimator": "gae"},
        "lora": {"lora_r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "data": {"train_dataset": "rows.jsonl"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "worker.py").write_text(WORKER)
    one, two = _run(tmp_path, 1), _run(tmp_path, 2)
    assert two["actor_dtensor"] and two["critic_adapter_dtensor"]  # critic adapter: sharded
    assert two["value_head_plain"]  # value head: replicated
    assert two["critic_params_live"]
    assert two["critic_grad_norm"] == pytest.approx(one["critic_grad_norm"], rel=1e-6)
    assert one["critic_grad_norm"] > 1.0  # so the clip applied: g * 1 / norm
    assert two["clipped_value_head_grad"] == pytest.approx(1 / one["critic_grad_norm"], rel=1e-5)
    assert two["q_full_in_rollout"] and one["q_full_in_rollout"]  # gathered, plain tensors
    assert two["responses"] == one["responses"]  # greedy: the same tokens as one process
    # rank 0 holds row 0; whitened over both ranks' tokens it matches the one-process row 0
    torch.testing.assert_close(
        torch.tensor(two["whitened"]), torch.tensor(one["whitened"][:1]), rtol=1e-6, atol=1e-6
    )
