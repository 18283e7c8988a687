"""kill -9 safety: a real ``python -m danka train`` killed at 10 random moments (a third of
them in the middle of a checkpoint write; the run lock each kill leaves behind is taken over
from the dead pid), resumed each
time with ``--resume auto``, finishes with the same record and bit-identical weights as a
run never killed.

The code has no hook to slow a checkpoint write, so one kill fires the moment a
``.tmp-checkpoint_*`` folder appears (the middle of a write, when the poll catches it) and
the others at random delays drawn from a seeded RNG; ``save_steps=1`` with many small
steps makes a random moment land in or near a checkpoint write often.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from danka.checkpoint import find_latest_checkpoint, verify_checkpoint
from danka.io import read_json_lines

from .conftest import make_config, train_cli

STEPS = 80
KILLS = 10  # kill -9 ten times; every third one aimed at the middle of a checkpoint write
KILL_DELAYS_S = (0.0, 0.1)  # after a new step appears: steps of the tiny model take ~50 ms
REPO = Path(__file__).resolve().parents[2]


def _start(config: Path, out: Path, log_file) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "danka",
            "train",
            str(config),
            "--output-dir",
            str(out),
            "--resume",
            "auto",
        ],
        cwd=REPO,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its reward worker is in the same group, for clean-up
    )


def _metric_steps(out: Path) -> list[int]:
    # a line cut by the kill is skipped (the resume drops it)
    return [record["step"] for record in read_json_lines(out / "metrics.jsonl")]


def _latest_step(out: Path) -> int:
    latest = find_latest_checkpoint(out)
    return int(latest.name.split("_")[1]) if latest else 0


def _writing_checkpoint(out: Path) -> bool:
    return any(any(p.glob(".tmp-checkpoint_*")) for p in out.iterdir() if p.is_dir())


def _wait_for_progress(proc: subprocess.Popen, out: Path, after: int, timeout: float) -> bool:
    """Until a step beyond ``after`` is logged (True) or the process ends (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        if max(_metric_steps(out), default=0) > after:
            return True
        time.sleep(0.02)
    raise AssertionError(f"no step after {after} within {timeout} s")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.kill(proc.pid, signal.SIGKILL)  # the trainer only, as `kill -9 PID` would
    except ProcessLookupError:
        pass
    proc.wait()
    try:  # then anything it left in its session (the reward worker)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_auto(tmp_path, tiny_model_dir):
    config = make_config(
        tmp_path,
        tiny_model_dir,
        trainer={
            "total_steps": STEPS,
            "save_steps": 1,
            "keep_last": 2,
            "batch_size": 2,
            "samples_per_prompt": 2,
            "micro_batch_size": 4,
            "max_new_tokens": 4,
        },
    )
    out = tmp_path / "out"
    rng = random.Random(1234)
    kills = []  # (last logged step, step of the newest complete checkpoint) at each kill
    starts = []  # the step each process should resume at (0: a fresh start)
    proc = None
    console = open(tmp_path / "console.txt", "ab")

    def start() -> subprocess.Popen:
        starts.append(_latest_step(out))
        return _start(config, out, console)

    try:
        for attempt in range(KILLS):
            proc = start()
            logged = max(_metric_steps(out), default=0)
            if not _wait_for_progress(proc, out, logged, timeout=120):
                break  # finished before this kill: nothing left to interrupt
            if attempt % 3 == 0:  # aim at the middle of a checkpoint write
                end = time.monotonic() + 10
                while time.monotonic() < end and proc.poll() is None:
                    if _writing_checkpoint(out):
                        break
                    time.sleep(0.001)
            else:
                time.sleep(rng.uniform(*KILL_DELAYS_S))
            _kill(proc)
            kills.append((max(_metric_steps(out), default=0), _latest_step(out)))
        proc = start()
        assert proc.wait(timeout=180) == 0, (tmp_path / "console.txt").read_text()[-3000:]
    finally:
        console.close()
        if proc is not None and proc.poll() is None:
            _kill(proc)

    assert len(kills) == KILLS, kills  # every kill landed before the run could finish
    # the run completed and its final checkpoint is complete
    verify_checkpoint(out / "state" / f"checkpoint_{STEPS}")
    assert (out / "actor" / f"checkpoint_{STEPS}" / "adapter_model.safetensors").is_file()
    # exactly one metrics line per step, none twice, no gap
    assert _metric_steps(out) == list(range(1, STEPS + 1))
    # each process started at the newest complete checkpoint the kill before it left...
    log = (out / "logs" / "train.log").read_text().splitlines()
    started_at = [
        0 if "no complete checkpoint" in x else int(x.rsplit(" ", 1)[1])
        for x in log
        if "Resumed from" in x or "--resume auto: no complete" in x
    ]
    assert started_at == starts
    # ...and with save_steps=1 only the step whose checkpoint was being written was redone
    for logged, ckpt in kills:
        assert 0 <= logged - ckpt <= 1, kills
    # no temporary or incomplete checkpoint folder is left behind (keep_last=2 pruned them)
    leftovers = [p for part in out.iterdir() if part.is_dir() for p in part.glob(".tmp-*")]
    assert leftovers == []
    steps = sorted(int(p.name.split("_")[1]) for p in (out / "state").glob("checkpoint_*"))
    assert steps == [STEPS - 1, STEPS]
    # and the weights are bit-identical to a run that was never killed
    reference = tmp_path / "reference"
    assert train_cli(config, reference) == 0
    name = f"checkpoint_{STEPS}/adapter_model.safetensors"
    killed, clean = load_file(out / "actor" / name), load_file(reference / "actor" / name)
    assert killed.keys() == clean.keys()
    assert all(torch.equal(killed[k], clean[k]) for k in clean)
