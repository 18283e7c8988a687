"""DAPO dynamic sampling inside ``danka train`` (tiny model, CPU): no update ever sees a
group of equal rewards, a step with no informative group skips the update, and a resumed
run is bit-identical to an uninterrupted one (the sampler's state is in the checkpoint)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from danka.checkpoint import load_trainer_state
from danka.step.stages import Stages

from .conftest import make_config, train_cli

# prompts "What is i + (i+1)?": an even i gets the same reward for every answer (a flat
# group, dropped), an odd i a reward that varies with the answer's characters
HALF_FLAT = """
def reward(prompts, completions, **columns):
    out = []
    for p, c in zip(prompts, completions):
        i = int(p.split("What is ")[1].split(" ")[0])
        out.append(0.5 if i % 2 == 0 else float(sum(map(ord, c)) % 7) / 6.0)
    return out
"""
FLAT = """
def reward(prompts, completions, **columns):
    return [1.0 for _ in completions]
"""
DAPO = {"dynamic_sampling": True, "max_sampling_rounds": 3, "samples_per_prompt": 4}


def _config(tmp_path: Path, model_dir: Path, reward: str, **trainer) -> Path:
    (tmp_path / "ds_reward.py").write_text(reward)
    return make_config(
        tmp_path,
        model_dir,
        trainer={**DAPO, **trainer},
        reward={"functions": [{"name": "ds_reward.py:reward"}]},
    )


def _metrics(out: Path) -> list[dict]:
    clock = ("timestamp", "time/", "throughput/", "perf/")  # perf: FLOPs / seconds
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in x.items() if not k.startswith(clock)} for x in lines]


def test_no_update_trains_on_a_group_of_equal_rewards(tmp_path, tiny_model_dir, monkeypatch):
    seen = []
    original = Stages.advantages

    def spy(self, scored, logp, values):
        seen.append((scored.rewards.clone(), scored.batch.group_index.clone(), logp.valid))
        return original(self, scored, logp, values)

    monkeypatch.setattr(Stages, "advantages", spy)
    config = _config(tmp_path, tiny_model_dir, HALF_FLAT, total_steps=3)
    assert train_cli(config, tmp_path / "out") == 0
    assert len(seen) == 3
    for rewards, groups, valid in seen:
        for g in groups.unique():
            r = rewards[(groups == g) & valid]
            assert r.numel() >= 2 and (r != r[0]).any(), rewards  # never a flat group
    m = _metrics(tmp_path / "out")
    assert sum(x["dynamic_sampling/groups_dropped"] for x in m) > 0  # the filter did work
    assert all(1 <= x["dynamic_sampling/rounds"] <= 3 for x in m)
    assert all(x["dynamic_sampling/groups_kept"] <= 2 for x in m)  # batch_size 2


def test_a_step_without_informative_groups_skips_the_update(tmp_path, tiny_model_dir):
    """Every reward equal: each step generates max_sampling_rounds rounds, drops every
    group, trains on nothing (the adapter stays at its init: lora_B = 0), and the run
    ends normally (a skipped update is not a non-finite step)."""
    config = _config(tmp_path, tiny_model_dir, FLAT, total_steps=4, max_sampling_rounds=2)
    out = tmp_path / "out"
    assert train_cli(config, out) == 0
    m = _metrics(out)
    assert [x["dynamic_sampling/rounds"] for x in m] == [2.0] * 4
    assert all(x["dynamic_sampling/skipped_update"] == 1.0 for x in m)
    assert (
        "dynamic sampling found no group with differing rewards in 2 round(s)"
        in (out / "logs" / "train.log").read_text()
    )
    adapter = load_file(out / "actor" / "checkpoint_4" / "adapter_model.safetensors")
    assert all(not v.any() for k, v in adapter.items() if "lora_B" in k)


def test_resume_with_dynamic_sampling_is_exact(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir, HALF_FLAT, save_steps=1)
    full, half = tmp_path / "full", tmp_path / "half"
    assert train_cli(config, full, "trainer.total_steps=4") == 0
    assert train_cli(config, half, "trainer.total_steps=2") == 0
    resumed = tmp_path / "resumed"
    shutil.copytree(half, resumed)
    assert train_cli(config, resumed, "trainer.total_steps=4", "--resume", "auto") == 0
    name = "checkpoint_4/adapter_model.safetensors"
    a, b = load_file(full / "actor" / name), load_file(resumed / "actor" / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(half / "actor" / "checkpoint_2" / "adapter_model.safetensors")
    assert any(not torch.equal(start[k], a[k]) for k in a)  # the run moved
    assert _metrics(resumed) == _metrics(full)
    # the sampler's running totals continue across the resume
    s_full = load_trainer_state(full / "state" / "checkpoint_4")["dynamic_sampler"]
    s_resumed = load_trainer_state(resumed / "state" / "checkpoint_4")["dynamic_sampler"]
    assert s_full == s_resumed and s_full["total_rounds"] >= 4
