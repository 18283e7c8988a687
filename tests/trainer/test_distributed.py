"""Two processes (torchrun, gloo on CPU) against one: same update, checkpoints that resume.

FSDP2 ``fully_shard`` runs on CPU/gloo with this torch, so these tests exercise the real
sharded path (no DDP fallback). Each test launches ``torch.distributed.run --standalone``
(a free port is picked by torchrun), so it takes a few seconds per process start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from danka.config import load_config
from danka.trainer.fit import fit

from .conftest import make_config

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import logging, sys
from pathlib import Path
import torch
from danka import distributed as dist
from danka.config import load_config
from danka.step.metrics import update_metrics
from danka.step.records import ON_POLICY, OldAndRef, RewardStats, Rollout, Scored, TrainBatch
from danka.trainer.build import build
from danka.step.update import NonFiniteError, update
from danka.types import RolloutBatch

cfg, base = load_config(sys.argv[1])
built = build(cfg, base, Path(cfg.output_dir), logging.getLogger("worker"))
stages = built.stages
d = torch.load(sys.argv[2], weights_only=True)
if dist.is_active():  # this rank's contiguous half: whole GRPO groups
    k = d["rewards"].shape[0] // dist.world_size()
    d = {key: v[dist.rank() * k : (dist.rank() + 1) * k] for key, v in d.items()}
n = d["rewards"].shape[0]
rollout = Rollout(RolloutBatch(**{k: d[k] for k in (
    "prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_index", "truncated")}),
    [""] * n, [""] * n)
valid = torch.ones(n, dtype=torch.bool)
scored = Scored(rollout, d["rewards"], {}, valid, RewardStats(0.0, {}, 0.0, 0.0, 1.0, 0.0, 0.0, None))
out = {}
if stages.algo.needs_critic:  # gae, whitened over the whole batch (all ranks)
    logp = OldAndRef(old=ON_POLICY, ref=None, is_weights=None, valid=valid, logprob_gap=None)
    batch = stages.advantages(scored, logp, d["values"]).batch
    parts = [None] * dist.world_size()
    if dist.is_active():
        torch.distributed.all_gather_object(parts, batch.advantages, group=dist.cpu_group())
    out["advantages"] = torch.cat(parts) if dist.is_active() else batch.advantages
else:  # one optimiser step: pi_old is the policy being updated
    rb = rollout.batch
    batch = TrainBatch.of(rb, valid=valid, advantages=d["advantages"], old_logprobs=ON_POLICY)
if sys.argv[4:] == ["nan_on_rank_1"] and dist.rank() == 1:
    batch.advantages = torch.full_like(batch.advantages, float("nan"))
try:
    stats = update(stages.models, stages.algo, stages.opts, batch, stages.updating,
                   micro_size=built.micro, kl_coef=0.0, generator=stages.generator)
    metrics = dist.reduce_metrics(*update_metrics(stats))
except NonFiniteError as err:  # every rank skips the same optimiser step
    metrics, out["skipped"] = {}, str(err)
if dist.is_active():
    state = dist.full_state_dict(stages.models.policy)
else:
    state = stages.models.policy.state_dict()
if stages.models.value_head is not None:
    state.update({"v_head." + k: v for k, v in stages.models.value_head.state_dict().items()})
if dist.is_main():
    out["state"] = {k: v.detach().float().cpu() for k, v in state.items()}
    out["metrics"] = dict(metrics)
    out["replicated"] = getattr(stages.models.policy, "_danka_replicated", False)
    torch.save(out, sys.argv[3])
dist.destroy()
"""


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _launch(args: list[str], nproc: int, cwd: Path) -> None:
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    proc = subprocess.run(
        cmd + args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _batch() -> dict:
    """8 sequences = 2 prompts x 4 samples; rank 0's half has long responses, rank 1's short
    ones, so normalising by local token counts (wrong) would weight the ranks differently,
    and so would whitening with per-rank statistics (rank 1's rewards are shifted by +3)."""
    g = torch.Generator().manual_seed(0)
    b, p, r = 8, 5, 6
    resp_len = torch.tensor([6, 5, 6, 4, 2, 1, 3, 2])
    response_mask = (torch.arange(r)[None, :] < resp_len[:, None]).float()
    prompt_mask = torch.ones(b, p, dtype=torch.long)
    prompt_mask[:, 0] = 0  # one column of left padding
    return dict(
        prompt_ids=torch.randint(3, 60, (b, p), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 60, (b, r), generator=g) * response_mask.long(),
        response_mask=response_mask,
        group_index=torch.arange(b) // 4,
        truncated=torch.zeros(b, dtype=torch.bool),
        rewards=torch.randn(b, generator=g) + 3.0 * (torch.arange(b) >= 4),
        advantages=torch.randn(b, 1, generator=g).expand(b, r) * response_mask,
        values=torch.randn(b, r, generator=g) * response_mask,  # read by gae (PPO) only
    )


# (case, config sections): max_grad_norm 0.1 clips, so the global norm over sharded (DTensor)
# and replicated tensors (full-parameter embeddings; the critic's value head) is exercised
SHARD = {"backend": {"fsdp": {"sharding": "shard"}}}
CASES = {  # backend.fsdp.sharding auto replicates the tiny model; "_shard" forces FSDP2
    "grpo_lora": {},
    "grpo_lora_shard": SHARD,
    "grpo_full": {"lora": {"enable_lora": False}},
    "grpo_full_shard": {"lora": {"enable_lora": False}, **SHARD},
    "ppo_lora": {"trainer": {"algorithm": "ppo", "samples_per_prompt": 4}},
    "ppo_lora_shard": {"trainer": {"algorithm": "ppo", "samples_per_prompt": 4}, **SHARD},
}


@pytest.mark.parametrize(
    "case",
    [
        "grpo_lora",
        "grpo_lora_shard",
        pytest.param("grpo_full", marks=pytest.mark.slow),
        pytest.param("grpo_full_shard", marks=pytest.mark.slow),
        "ppo_lora",
        pytest.param("ppo_lora_shard", marks=pytest.mark.slow),
    ],
)
def test_two_ranks_update_equals_one_process(tmp_path, tiny_model_dir, case):
    sections = {k: dict(v) for k, v in CASES[case].items()}
    sections.setdefault("trainer", {}).update(max_grad_norm=0.1)
    cfg = make_config(tmp_path, tiny_model_dir, **sections)
    (tmp_path / "worker.py").write_text(WORKER)
    torch.save(_batch(), tmp_path / "batch.pt")
    for nproc in (1, 2):
        _launch(["worker.py", str(cfg), "batch.pt", f"out{nproc}.pt"], nproc, tmp_path)
    one, two = (torch.load(tmp_path / f"out{n}.pt", weights_only=True) for n in (1, 2))
    assert one["state"].keys() == two["state"].keys() and one["state"]
    init = (
        {}
        if not case.startswith("grpo_full")
        else {k: v.float() for k, v in _initial_weights(tiny_model_dir).items()}
    )
    moved = [
        k
        for k, v in one["state"].items()
        if ("lora_B" in k and v.abs().sum() > 0) or (k in init and not torch.equal(v, init[k]))
    ]
    assert moved  # the update did change the trained weights
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, atol=1e-5, rtol=1e-5)
    # the gradient norm is taken before clipping and Adam's step: a x2 (mean vs sum) error
    # or a per-rank norm shows here
    keys = ["actor/grad_norm", "actor/pg_loss", "actor/entropy"]
    # auto replicates the tiny model (weights <= 4 GiB); one process never does
    assert not one["replicated"] and two["replicated"] is not case.endswith("_shard")
    if case.startswith("ppo_lora"):
        keys += ["critic/grad_norm", "critic/vf_loss"]
        # gae whitened with the statistics of both ranks' tokens, not each rank's own
        torch.testing.assert_close(two["advantages"], one["advantages"], atol=1e-5, rtol=1e-5)
        # the critic adapter is compared above; at step 1 only the head learns (it starts
        # at zero, so no gradient reaches the adapter yet)
        assert any(".critic." in k for k in one["state"])
        assert any(v.abs().sum() > 0 for k, v in one["state"].items() if "v_head" in k)
    for key in keys:
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-6)
    assert one["metrics"]["actor/grad_norm"] > 0.1  # so max_grad_norm did clip


def test_non_finite_loss_on_one_rank_skips_the_step_on_both(tmp_path, tiny_model_dir):
    """Rank 1's loss is NaN, rank 0's finite: both skip the optimiser step (no rank is left
    waiting in the backward's gradient collectives) and the weights stay as they were."""
    cfg = make_config(tmp_path, tiny_model_dir)
    (tmp_path / "worker.py").write_text(WORKER)
    torch.save(_batch(), tmp_path / "batch.pt")
    _launch(["worker.py", str(cfg), "batch.pt", "out.pt", "nan_on_rank_1"], 2, tmp_path)
    out = torch.load(tmp_path / "out.pt", weights_only=True)  # rank 0's view
    assert out["skipped"].startswith("policy loss is") and "another rank" in out["skipped"]
    lora_b = [v for k, v in out["state"].items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().sum()) == 0.0 for v in lora_b)  # B still zero


def _initial_weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.parametrize("sharding", ["shard", pytest.param("auto", marks=pytest.mark.slow)])
def test_torchrun_training_writes_once_and_resumes_on_one_process(
    tmp_path, tiny_model_dir, sharding
):
    cfg_path = make_config(
        tmp_path, tiny_model_dir, data={"eval_size": 2}, backend={"fsdp": {"sharding": sharding}}
    )
    danka = ["-m", "danka", "train", str(cfg_path), "--nproc", "2"]
    _launch(danka, 1, tmp_path)  # the --nproc shortcut re-runs itself through torchrun
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]  # rank 0 alone writes
    assert all(torch.isfinite(torch.tensor(x["loss"])) for x in lines)
    log = (out / "logs" / "train.log").read_text()
    line = {"shard": "FSDP2: policy sharded over 2 processes", "auto": "policy replicated on 2"}
    assert log.count(line[sharding]) == 1
    assert (out / "actor" / "checkpoint_2" / "adapter_model.safetensors").exists()
    assert sorted(p.name for p in (out / "eval").iterdir()) == [
        "probe_reference.safetensors",  # the drift probe's base-model answers (rank 0 writes)
        "step_0.json",
        "step_2.json",
    ]
    # the gathered checkpoint has the single-process layout: one process resumes it
    cfg, base = load_config(cfg_path, ["trainer.total_steps=3"])
    fit(cfg, base, resume="auto")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert "Resumed from" in (out / "logs" / "train.log").read_text()


BAD_ON_RANK_1 = """
import os


def reward(prompts, completions, **columns):
    # the preflight check (ground-truth answers with ####) passes; training fails on rank 1
    if os.environ.get("RANK") == "1" and not all("####" in c for c in completions):
        raise ValueError("cannot score this completion")
    return [0.0] * len(completions)
"""


@pytest.mark.slow
def test_bad_input_on_one_rank_exits_2_with_one_message(tmp_path, tiny_model_dir):
    """A reward function that fails only on rank 1, after the process group is up: the
    launcher exits 2 (not torchrun's 1) with the one-line message and no launcher traceback,
    and the other rank does not hang."""
    cfg_path = make_config(tmp_path, tiny_model_dir)
    (tmp_path / "reward.py").write_text(BAD_ON_RANK_1)
    proc = subprocess.run(
        [sys.executable, "-m", "danka", "train", str(cfg_path), "--nproc", "2"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert proc.stderr.count("danka: error:") == 1
    assert "cannot score this completion" in proc.stderr
    assert "ChildFailedError" not in proc.stderr and "distributed/run.py" not in proc.stderr
    assert "closed by peer" not in proc.stderr  # rank 0's failure is a consequence: quiet


ROLLOUT_WORKER = """
import logging, sys
from pathlib import Path
import torch
from danka import distributed as dist
from danka.config import load_config
from danka.trainer.build import build

cfg, base = load_config(sys.argv[1])
built = build(cfg, base, Path(cfg.output_dir), logging.getLogger("worker"))
stages = built.stages
rows, idx = [], stages.next_prompts()
for step in range(2):  # the same prompts twice, the weights changed in between
    batch = stages.sample(idx, built.micro).batch
    rows += [(step, int(i), ids[m.bool()].tolist()) for i, ids, m in
             zip(batch.prompt_index, batch.response_ids, batch.response_mask)]
    with torch.no_grad():  # as an optimiser step does: on the (sharded) trained parameters
        for p in stages.models.actor_params:
            p.add_(0.3)
parts = [None] * dist.world_size()
if dist.is_active():
    torch.distributed.all_gather_object(parts, rows, group=dist.cpu_group())
    rows = [r for part in parts for r in part]
if dist.is_main():
    torch.save(rows, sys.argv[2])
dist.destroy()
"""


def test_fast_engine_rolls_out_on_gathered_weights_on_two_ranks(tmp_path, tiny_model_dir):
    """The fast engine reads the parameters directly (EngineMeta.reads_weights): under FSDP2
    the rollout gathers full weights, and each rank answers its own prompts, greedily the
    same tokens as one process answering all of them."""
    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        rollout={"engine": "fast"},
        trainer={"temperature": 0.0, "samples_per_prompt": 2, "batch_size": 4},
        data={"shuffle": False},
    )
    (tmp_path / "worker.py").write_text(ROLLOUT_WORKER)
    for nproc in (1, 2):
        _launch(["worker.py", str(cfg), f"rows{nproc}.pt"], nproc, tmp_path)
    one, two = (torch.load(tmp_path / f"rows{n}.pt", weights_only=True) for n in (1, 2))
    assert sorted(i for step, i, _ in two if step == 0) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert sorted(two) == sorted(one) and any(ids for _, _, ids in one)
    # the change of weights changes the answers (so 2 ranks re-read them, none stale)
    answers = [sorted((i, ids) for s, i, ids in one if s == step) for step in (0, 1)]
    assert answers[0] != answers[1]
