"""Exact resume on CPU with the tiny model.

N steps, stop, ``--resume auto``, N more steps must give weights bit-identical (torch.equal
on every tensor) to 2N uninterrupted steps: the adapter for GRPO+LoRA; for PPO also the
critic adapter and the value head. Plus: ``--resume PATH``, ``--resume auto`` without a
checkpoint, a checkpoint from another model, a truncated checkpoint file.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from danka.checkpoint import find_latest_checkpoint, verify_checkpoint
from danka.cli import main
from danka.logging.runlog import LINE_PREFIX, close_run_logger

from .conftest import make_config

N = 2  # steps per half
PPO = {"algorithm": "ppo", "samples_per_prompt": 1, "micro_batch_size": 1, "batch_size": 2}


def _train(config: Path, out: Path, steps: int, *flags: str, overrides: tuple = ()) -> int:
    # overrides go before the --flags: argparse rejects positionals after them (see report)
    try:
        return main(
            [
                "train",
                str(config),
                f"trainer.total_steps={steps}",
                *overrides,
                "--output-dir",
                str(out),
                *flags,
            ]
        )
    finally:
        close_run_logger()  # the next run in this process opens its own train.log


def _tensors(out: Path, step: int) -> dict[str, torch.Tensor]:
    """Every saved weight of checkpoint ``step``: actor adapter, critic adapter, value head."""
    found = {}
    for part in ("actor", "critic"):
        folder = out / part / f"checkpoint_{step}"
        for file in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
            found.update({f"{part}/{file.name}/{k}": v for k, v in load_file(file).items()})
    return found


def _log(out: Path) -> str:
    return (out / "logs" / "train.log").read_text()


def _metrics(out: Path) -> list[dict]:
    clock = ("timestamp", "time/", "throughput/", "perf/")  # perf: FLOPs / seconds
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in x.items() if not k.startswith(clock)} for x in lines]


def _metric_steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


def _three_runs(algo: str, root: Path, model_dir: Path) -> dict:
    """One config; ``full``: 2N steps straight; ``half``: N steps then stopped (kept for the
    tests below to copy); ``resumed``: a copy of ``half`` resumed with --resume auto to 2N."""
    if algo == "ppo":
        config = make_config(root, model_dir, trainer={**PPO, "save_steps": 1})
    else:  # every stateful piece on: dropout RNG, adaptive KL controller, held-out eval
        config = make_config(
            root,
            model_dir,
            lora={"lora_dropout": 0.1},
            data={"train_dataset": "rows.jsonl", "eval_size": 4},
            trainer={"save_steps": 1, "kl": {"coef": 0.05, "adaptive": True, "mode": "reward"}},
        )
    full, half, resumed = root / "full", root / "half", root / "resumed"
    assert _train(config, full, 2 * N) == 0
    assert _train(config, half, N) == 0
    shutil.copytree(half, resumed)
    assert _train(config, resumed, 2 * N, "--resume", "auto") == 0
    return {"algo": algo, "config": config, "full": full, "half": half, "resumed": resumed}


@pytest.fixture(scope="module")
def grpo(tmp_path_factory, tiny_model_dir):
    return _three_runs("grpo", tmp_path_factory.mktemp("resume_grpo"), tiny_model_dir)


@pytest.fixture(scope="module")
def ppo(tmp_path_factory, tiny_model_dir):
    return _three_runs("ppo", tmp_path_factory.mktemp("resume_ppo"), tiny_model_dir)


@pytest.fixture(params=["grpo", "ppo"])
def runs(request):
    return request.getfixturevalue(request.param)


def test_resume_is_bit_identical_to_an_uninterrupted_run(runs):
    """The GRPO config also has LoRA dropout, an adaptive KL controller and a held-out eval
    (the first half evaluates at step N, the uninterrupted run does not): none may shift
    the RNG or the state."""
    full, resumed = _tensors(runs["full"], 2 * N), _tensors(runs["resumed"], 2 * N)
    assert full.keys() == resumed.keys()
    assert any(k.startswith("actor/") and "lora_B" in k for k in full)
    if runs["algo"] == "ppo":  # the critic adapter and the value head are compared too
        assert any(k.startswith("critic/adapter") for k in full)
        assert any(k.startswith("critic/value_head") for k in full)
    different = [k for k in full if not torch.equal(full[k], resumed[k])]
    assert different == []
    # the run moved: step 2N differs from step N, so equality above is not vacuous
    half = _tensors(runs["half"], N)
    assert any(not torch.equal(half[k], full[k]) for k in full)
    assert _metric_steps(runs["resumed"]) == list(range(1, 2 * N + 1))
    # every logged number but the clock is the same too (rewards, KL, losses, kl_coef...)
    assert _metrics(runs["resumed"]) == _metrics(runs["full"])


def test_resume_logs_the_step_and_the_changed_total_steps(runs):
    log = _log(runs["resumed"])
    assert f"Resumed from {runs['resumed'] / 'state' / f'checkpoint_{N}'} at step {N}" in log
    warning = [x for x in log.splitlines() if "resuming with a changed config" in x]
    assert len(warning) == 1 and re.match(LINE_PREFIX + r"\[WARNING\]", warning[0])
    assert f"trainer.total_steps: {N} -> {2 * N}" in warning[0]


def test_resume_path_to_a_state_checkpoint(grpo, tmp_path):
    """--resume PATH resumes from that (older) checkpoint, not the newest one."""
    out = tmp_path / "out"
    shutil.copytree(grpo["full"], out)
    older = str(out / "state" / "checkpoint_1")  # newer ones exist: --discard-newer says go
    assert _train(grpo["config"], out, 2 * N, "--resume", older, "--discard-newer") == 0
    assert f"Resumed from {out / 'state' / 'checkpoint_1'} at step 1" in _log(out)
    full = _tensors(grpo["full"], 2 * N)
    again = _tensors(out, 2 * N)
    assert all(torch.equal(full[k], again[k]) for k in full)
    assert _metric_steps(out) == list(range(1, 2 * N + 1))


def test_resume_path_to_an_older_checkpoint_drops_the_newer_ones(grpo, tmp_path):
    """Checkpoints after the resume point belong to the abandoned continuation: kept, a later
    ``--resume auto`` would jump back onto them (and find no metrics lines for their steps)."""
    out = tmp_path / "out"
    shutil.copytree(grpo["full"], out)  # checkpoints 1..2N
    older = str(out / "state" / "checkpoint_1")
    assert _train(grpo["config"], out, 2, "--resume", older, "--discard-newer") == 0
    assert sorted(p.name for p in (out / "state").iterdir()) == ["checkpoint_1", "checkpoint_2"]
    assert not (out / "actor" / f"checkpoint_{2 * N}").exists()
    assert find_latest_checkpoint(out) == out / "state" / "checkpoint_2"
    assert f"removing checkpoint_{2 * N} (newer than the resumed step 1)" in _log(out)
    assert _metric_steps(out) == [1, 2]


def test_resume_path_to_the_actor_folder_is_accepted(grpo, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(grpo["half"], out)
    assert (
        _train(grpo["config"], out, N + 1, "--resume", str(out / "actor" / f"checkpoint_{N}")) == 0
    )
    assert f"Resumed from {out / 'state' / f'checkpoint_{N}'} at step {N}" in _log(out)


def test_resume_auto_without_a_checkpoint_starts_fresh(grpo, tmp_path):
    """Behaviour: ``--resume auto`` with nothing to resume is not an error (a job script can
    always pass it); it says so in the log and trains from step 0."""
    out = tmp_path / "out"
    assert _train(grpo["config"], out, 1, "--resume", "auto") == 0
    log = _log(out)
    assert "--resume auto: no complete checkpoint in" in log and "starting from step 0" in log
    assert "Resumed from" not in log
    assert _metric_steps(out) == [1]


def test_resume_with_another_model_exits_2(grpo, tmp_path, capsys):
    other = tmp_path / "other_model"
    from danka.models.tiny import save_tiny_model

    save_tiny_model(other, seed=1)
    out = tmp_path / "out"
    shutil.copytree(grpo["half"], out)
    before = sorted(p.name for p in (out / "state").iterdir())
    code = _train(
        grpo["config"],
        out,
        2 * N,
        "--resume",
        "auto",
        overrides=(f"model.actor_model_name_or_path={other}",),
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "checkpoint was trained on" in err and str(other) in err
    assert "Traceback" not in err
    assert sorted(p.name for p in (out / "state").iterdir()) == before
    assert _metric_steps(out) == list(range(1, N + 1))  # nothing truncated or appended


def _truncate_adapter(out: Path, step: int) -> Path:
    file = out / "actor" / f"checkpoint_{step}" / "adapter_model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    return file


def test_corrupted_checkpoint_with_resume_path_exits_2_naming_the_file(grpo, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(grpo["half"], out)
    bad = _truncate_adapter(out, N)
    code = _train(grpo["config"], out, 2 * N, "--resume", str(out / "state" / f"checkpoint_{N}"))
    assert code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "corrupted" in err and "Traceback" not in err
    assert _metric_steps(out) == list(range(1, N + 1))


def test_corrupted_newest_checkpoint_resume_auto_falls_back(grpo, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(grpo["half"], out)
    _truncate_adapter(out, N)
    assert find_latest_checkpoint(out) == out / "state" / f"checkpoint_{N - 1}"
    assert _train(grpo["config"], out, 2 * N, "--resume", "auto") == 0
    log = _log(out)
    assert f"Resumed from {out / 'state' / f'checkpoint_{N - 1}'} at step {N - 1}" in log
    verify_checkpoint(out / "state" / f"checkpoint_{2 * N}")
    verify_checkpoint(out / "state" / f"checkpoint_{N}")  # rewritten whole by the resumed run
    full, again = _tensors(grpo["full"], 2 * N), _tensors(out, 2 * N)
    assert all(torch.equal(full[k], again[k]) for k in full)
    assert _metric_steps(out) == list(range(1, 2 * N + 1))
