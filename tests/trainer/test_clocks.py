"""The run's clocks (eval.every_minutes, checkpoint.save_minutes, trainer.max_train_minutes)
decided once per step for every rank: a unit test on a fake clock, and two gloo ranks in
the window where a per-rank save decision sent one rank alone into the state gather."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from danka.config.load import config_from_dict
from danka.trainer.clocks import Due, RunClocks

from .conftest import make_config

ROOT = Path(__file__).resolve().parents[2]

# every rank sleeps STEP_S at each step (so a step lasts about that long), rank 0 sleeps
# WRITE_S more after each checkpoint (a slow disk); checkpoint.save_minutes lies between
SLOW_RUN = """
import sys, time
import danka
from danka.callbacks import Callback

class Slow(Callback):
    def on_step(self, step, metrics):
        time.sleep(2.0)

    def on_checkpoint(self, step, path):
        if path is not None:  # rank 0 wrote it
            time.sleep(8.0)

danka.train(sys.argv[1], callbacks=[Slow()], plot=False)
"""


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _clocks(tmp_path, **sections) -> tuple[RunClocks, FakeClock]:
    base = {"model": {"actor_model_name_or_path": "unused"}, "data": {"train_dataset": "x"}}
    cfg = config_from_dict({**base, **sections}, base_dir=tmp_path)
    now = FakeClock()
    return RunClocks.start(cfg, logging.getLogger("test"), now), now


def test_minutes_count_from_the_last_evaluation_and_save(tmp_path):
    clocks, now = _clocks(
        tmp_path,
        trainer={"total_steps": 100},
        eval={"every_minutes": 0.5},
        checkpoint={"save_steps": 0, "save_minutes": 1.0},
    )
    now.t = 29
    assert clocks.after_step(1, 100) == Due(out_of_time=False, evaluate=False, save=False)
    now.t = 31
    assert clocks.after_step(2, 100) == Due(out_of_time=False, evaluate=True, save=False)
    clocks.evaluated()  # the evaluation clock restarts at 31 s, the save clock does not
    now.t = 60
    assert clocks.after_step(3, 100) == Due(out_of_time=False, evaluate=False, save=True)
    clocks.saved()
    now.t = 62
    assert clocks.after_step(4, 100) == Due(out_of_time=False, evaluate=True, save=False)
    assert clocks.after_step(100, 100).save  # the last step always saves


def test_steps_and_the_time_limit(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    clocks, now = _clocks(
        tmp_path,
        trainer={"total_steps": 10, "max_train_minutes": 1.0},
        eval={"every_steps": 3, "every_minutes": 0},  # 0 = never by minutes
        checkpoint={"save_steps": 4},
    )
    now.t = 3600
    due = clocks.after_step(3, 10)
    assert due == Due(out_of_time=True, evaluate=True, save=True)  # late: the last step
    assert "trainer.max_train_minutes (1.0) reached at step 3" in caplog.text
    clocks, now = _clocks(tmp_path, trainer={"total_steps": 10}, checkpoint={"save_steps": 4})
    now.t = 10**9
    assert [s for s in range(1, 11) if clocks.after_step(s, 10).save] == [4, 8, 10]
    assert not any(clocks.after_step(s, 10).evaluate for s in range(1, 11))  # eval defaults


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


@pytest.mark.slow
def test_two_ranks_save_by_minutes_together(tmp_path, tiny_model_dir):
    """Full-parameter, sharded (the save gathers the state: a collective). A step takes
    about 2.5 s, rank 0's save 8 s more, checkpoint.save_minutes is 4 s: after the first
    save, a rank whose clock restarted before rank 0's write would save alone after the
    next step and wait in the gather forever (so did ranks whose clocks read either side
    of 4 s). The run must finish, bounded in time; saved after step 2 and the last."""
    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        trainer={"total_steps": 4, "save_steps": 0},
        checkpoint={"save_minutes": 4 / 60},
        lora={"enable_lora": False},
        backend={"fsdp": {"sharding": "shard"}},
    )
    (tmp_path / "worker.py").write_text(SLOW_RUN)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    log = tmp_path / "ranks.log"
    with log.open("w") as out:  # a file, not a pipe: a killed launcher's ranks hold no pipe open
        proc = subprocess.Popen(
            [*cmd, "worker.py", str(cfg)], cwd=tmp_path, env=_env(), stdout=out, stderr=out
        )
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            for pid in [*_descendants(proc.pid), proc.pid]:  # the ranks run in their own sessions
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
            pytest.fail("the two ranks hung (no exit in 180 s):\n" + log.read_text()[-3000:])
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    saved = sorted(int(p.name.split("_")[1]) for p in (out / "actor").glob("checkpoint_*"))
    assert saved[-1] == 4 and len(saved) >= 2  # by the minutes, and the last step
