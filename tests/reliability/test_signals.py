"""Signals at awkward moments, with real processes and real signals: during a checkpoint
save (the save finishes and the run exits, not after one more step), during a long step
under ``--nproc 2`` (a checkpoint is saved as one process does), and ``kill -9`` of the
``--nproc`` launcher (the ranks die with it; a new run never shares the folder with them).

A slow save or step is made by a ``sitecustomize`` hook that only these tests put on the
child's PYTHONPATH: it wraps one function of danka to sleep at one step and writes a
marker file when it starts sleeping, so the test signals at exactly that moment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danka.checkpoint import find_latest_checkpoint, verify_checkpoint
from danka.errors import UserError
from danka.lifecycle import RunLock

from .conftest import REPO, child_env, one_step_config, processes_with, wait_until

HOOK = '''
"""Test hook: DANKA_TEST_SLOW = "module:function:step:seconds:marker_file"."""
import importlib.abc, importlib.util, os, sys, time

_SPEC = os.environ.get("DANKA_TEST_SLOW")
if _SPEC:
    _MOD, _FN, _STEP, _SECONDS, _MARK = _SPEC.split(":")

    def _wrap(module):
        real, done = getattr(module, _FN), []

        def slow(*args, **kwargs):
            step = next((a for a in args if isinstance(a, int)), None)  # train_step's step
            if step is None:  # fsync_tree(path): find the step
                text = " ".join(map(str, args))
                step = int(_STEP) if f"checkpoint_{_STEP}-" in text else None
            if step == int(_STEP) and not done:
                done.append(step)
                with open(_MARK, "a") as f:
                    f.write(f"{os.getpid()}\\n")
                time.sleep(float(_SECONDS))
            return real(*args, **kwargs)

        setattr(module, _FN, slow)

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _MOD:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            spec.loader.exec_module = lambda m: (run(m), _wrap(m))
            return spec

    sys.meta_path.insert(0, _Hook())
'''


def _metric_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.endswith("}")]


def _start(tmp_path: Path, config: Path, out: Path, slow: str, *args: str) -> subprocess.Popen:
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = child_env(DANKA_TEST_SLOW=slow)
    env["PYTHONPATH"] = f"{hook_dir}{os.pathsep}{REPO}"
    cmd = [sys.executable, "-m", "danka", "train", str(config), "--output-dir", str(out), *args]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=open(tmp_path / "console.txt", "wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _snapshot(out: Path) -> dict[str, int]:
    return {
        str(p.relative_to(out)): p.stat().st_size
        for p in out.rglob("*")
        if p.is_file() and p.name != ".danka.lock" and "logs" not in p.parts
    }


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)]
)
def test_a_signal_during_a_checkpoint_save_finishes_the_save_and_exits(
    tmp_path, model_dir, sig, code
):
    """Before: the signal was honoured only after the NEXT step (one more step trained)."""
    config = one_step_config(tmp_path, model_dir, trainer={"total_steps": 40, "save_steps": 1})
    out, mark = tmp_path / "out", tmp_path / "saving"
    proc = _start(tmp_path, config, out, f"danka.checkpoint.store:_fsync_tree:2:6:{mark}")
    try:
        assert wait_until(mark.exists, 240), (tmp_path / "console.txt").read_text()[-3000:]
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        rc = proc.wait(timeout=120)
        seconds = time.monotonic() - t0
    finally:
        _stop(proc)
    text = (tmp_path / "console.txt").read_text()
    assert rc == code, text[-3000:]
    assert "Traceback" not in text
    assert seconds < 6 + 20, f"exited {seconds:.0f} s after the signal"  # the save sleeps 6 s
    assert _metric_steps(out) == [1, 2], "a step was trained after the signal"
    assert find_latest_checkpoint(out) == out / "state" / "checkpoint_2"
    verify_checkpoint(out / "state" / "checkpoint_2")
    assert f"{sig.name}: stopped after step 2 (checkpoint saved)" in text


@pytest.mark.slow
def test_nproc_sigterm_during_a_long_step_saves_a_checkpoint(tmp_path, model_dir):
    """Before: torchrun got the signal and SIGKILLed the ranks 30 s later, mid-step: exit
    143 with NO checkpoint. Now the ranks get it, finish the step and save."""
    config = one_step_config(tmp_path, model_dir, trainer={"total_steps": 40, "save_steps": 0})
    out, mark = tmp_path / "out", tmp_path / "long_step"
    slow = f"danka.trainer.fit:train_step:2:35:{mark}"  # step 2 takes 35 s on every rank
    proc = _start(tmp_path, config, out, slow, "--nproc", "2")
    try:
        assert wait_until(lambda: mark.exists() and len(mark.read_text().split()) == 2, 300), (
            tmp_path / "console.txt"
        ).read_text()[-3000:]
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=180)
    finally:
        _stop(proc)
    text = (tmp_path / "console.txt").read_text()
    assert rc == 143, text[-3000:]
    assert find_latest_checkpoint(out) == out / "state" / "checkpoint_2", text[-3000:]
    assert _metric_steps(out) == [1, 2]


@pytest.mark.slow
def test_nproc_ranks_die_with_a_killed_launcher_and_never_share_the_folder(tmp_path, model_dir):
    """Before: after kill -9 of the launcher, a new run took the output dir's lock while
    the old ranks were still training into it."""
    config = one_step_config(tmp_path, model_dir, trainer={"total_steps": 100000, "save_steps": 0})
    out = tmp_path / "out"
    proc = _start(tmp_path, config, out, "", "--nproc", "2")
    try:
        assert wait_until(lambda: bool(_metric_steps(out)), 300), (
            tmp_path / "console.txt"
        ).read_text()[-3000:]
        assert len(processes_with(str(out))) >= 4  # launcher, torchrun, two ranks
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        while True:  # what a new run does: take the lock as soon as it is free
            assert time.monotonic() - t0 < 30, f"the ranks lived on: {processes_with(str(out))}"
            try:
                lock = RunLock(out).acquire()
                break
            except UserError as err:
                assert "still running in this output_dir" in str(err), str(err)
                time.sleep(0.02)
        try:  # while the new run holds the folder, nothing of the old one writes there
            before = _snapshot(out)
            time.sleep(3.0)
            assert _snapshot(out) == before, "the old ranks wrote into the new run's folder"
        finally:
            lock.release()
        assert wait_until(lambda: not processes_with(str(out)), 10.0), processes_with(str(out))
    finally:
        _stop(proc)
        for pid in processes_with(str(out)):
            os.kill(pid, signal.SIGKILL)
