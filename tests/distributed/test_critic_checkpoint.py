"""The PPO critic's checkpoint state under FSDP2 (two gloo ranks) against one process:
gathered to the single-process layout on every rank, written by rank 0, loaded back into
sharded models (the functions danka/trainer/saving.py calls)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from .conftest import launch_worker

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import sys
from pathlib import Path
import torch
from danka import distributed as dist
from danka.config import load_config
from danka.models.tiny import tiny_causal_lm
from danka.step.model_set import build_models

dist.init(torch.device("cpu"))
cfg, _ = load_config(sys.argv[1])
folder = Path(sys.argv[2])


def fresh():
    # full-parameter PPO: the critic is its own model (+ replicated value head)
    models = build_models(cfg, tiny_causal_lm(seed=0), lambda: tiny_causal_lm(seed=1), print)
    if dist.is_active():
        dist.shard_models(models)
    return models, torch.optim.AdamW(models.critic_params, lr=1e-2)


models, opt = fresh()
for i, p in enumerate(models.critic_params):  # one Adam step on fixed gradients
    p.grad = torch.full_like(p, 0.1 * (i % 3 + 1))
opt.step()
full = dist.full_state_dict(models.policy) if dist.is_active() else models.policy.state_dict()
if dist.is_active():
    model_state, opt_state = dist.full_critic_state(models, opt, full)
else:
    model_state, opt_state = models.critic_model.state_dict(), opt.state_dict()
if dist.is_main():  # as checkpointing.save writes the critic
    models.critic_model.save_pretrained(folder / "critic", state_dict=model_state)
    torch.save({"opt": opt_state}, folder / "opt.pt")
dist.barrier()
# a fresh run restores it (every rank reads the files), then gathers it again
models2, opt2 = fresh()
dist.load_full_model(models2.critic_model, folder / "critic", torch.float32)
dist.load_optimizer_state(opt2, torch.load(folder / "opt.pt", weights_only=True)["opt"])
if dist.is_active():
    again, opt_again = dist.full_critic_state(models2, opt2, None)
else:
    again, opt_again = models2.critic_model.state_dict(), opt2.state_dict()
if dist.is_main():
    torch.save({"saved": {k: v.float() for k, v in model_state.items()}, "opt": opt_state,
                "again": {k: v.float() for k, v in again.items()}, "opt_again": opt_again},
               folder / "out.pt")
dist.destroy()
"""


def _run(tmp_path: Path, nproc: int) -> dict:
    folder = tmp_path / f"n{nproc}"
    folder.mkdir()
    launch_worker(tmp_path, nproc, ["config.yaml", str(folder)])
    return torch.load(folder / "out.pt", weights_only=True)


def _opt_tensors(state: dict) -> dict:
    return {(i, k): v for i, s in state["state"].items() for k, v in s.items()}


@pytest.mark.slow
def test_critic_state_gathers_and_restores_on_two_ranks(tmp_path):
    cfg = {
        "model": {"actor_model_name_or_path": "unused", "device": "cpu"},
        "trainer": {"algorithm": "ppo", "advantage_estimator": "gae"},
        "lora": {"enable_lora": False},
        "data": {"train_dataset": "rows.jsonl"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "worker.py").write_text(WORKER)
    one, two = _run(tmp_path, 1), _run(tmp_path, 2)
    # the gathered critic has the one-process layout and values (not rank 0's shard)
    assert two["saved"].keys() == one["saved"].keys()
    for key, value in one["saved"].items():
        torch.testing.assert_close(two["saved"][key], value)
    o1, o2 = _opt_tensors(one["opt"]), _opt_tensors(two["opt"])
    assert o1.keys() == o2.keys() and any(k[1] == "exp_avg" for k in o1)
    for key, value in o1.items():
        torch.testing.assert_close(torch.as_tensor(o2[key]), torch.as_tensor(value))
    # restored into freshly sharded models and gathered again: the same numbers
    for key, value in two["saved"].items():
        torch.testing.assert_close(two["again"][key], value)
    for key, value in o2.items():
        torch.testing.assert_close(torch.as_tensor(_opt_tensors(two["opt_again"])[key]), value)
