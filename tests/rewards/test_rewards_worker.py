"""The reward worker's life cycle (danka/usercode/worker.py), with real processes: timeouts
kill the worker's whole process group, builtins obey the timeout, and a killed or
terminated trainer leaves no worker behind and no BrokenPipe traceback."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from danka.rewards.builtin import REWARDS
from danka.rewards.custom import load_reward_function
from danka.rewards.guard import GuardedReward, RewardFunctionError
from danka.types import PromptRow

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead: it holds no CPU and no files)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_dead(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def wait_for_file(path: Path, seconds: float = 60.0) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def rows(n):
    return [PromptRow(index=i, prompt=f"p{i}", ground_truth="1") for i in range(n)]


def score(g, completions):
    rs = rows(len(completions))
    return g(rs, [r.prompt for r in rs], completions)


SPAWNS_SLEEP = """
import os, subprocess, time

def spawns(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "spawn":
        child = subprocess.Popen(["sleep", "300"])
        with open(os.environ["DANKA_TEST_PIDS"], "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        time.sleep(10**6)
    return 1.0
"""


def test_timeout_kills_processes_the_reward_started(tmp_path, monkeypatch):
    (tmp_path / "spawns.py").write_text(SPAWNS_SLEEP)
    pids = tmp_path / "pids"
    monkeypatch.setenv("DANKA_TEST_PIDS", str(pids))  # inherited by the worker
    g = GuardedReward(
        "spawns",
        load_reward_function(f"{tmp_path}/spawns.py:spawns", tmp_path),
        timeout_s=3.0,
        on_error="zero",
    )
    try:
        got = score(g, ["spawn", "ok"])
        worker, sleeper = map(int, pids.read_text().split())
        assert got.values == [0.0, 1.0] and got.num_errors == 1  # timed out, then served
        # before the fix only the worker was killed: `sleep 300` lived on
        assert wait_dead(sleeper, 5.0), "the sleep started by the reward survived the timeout"
        assert wait_dead(worker, 5.0)
    finally:
        g.close()


# (a+)+$ on "aaaa...ab" backtracks 2**40 times: minutes, inside re (holding the GIL).
EVIL = r"(a+)+$"


def test_builtin_format_with_a_pathological_regex_times_out():
    g = GuardedReward(
        "format", REWARDS["format"], {"pattern": EVIL}, timeout_s=1.0, on_error="zero"
    )
    try:
        score(g, ["warm-up"])  # starts the worker, so the timing below is the call's
        t0 = time.monotonic()
        got = score(g, ["a" * 40 + "b", "aaa"])
        elapsed = time.monotonic() - t0
    finally:
        g.close()
    assert got.values == [0.0, 1.0] and got.num_errors == 1
    assert elapsed < 10.0, f"builtin ran {elapsed:.1f} s past its 1 s timeout"


def test_builtin_timeout_under_fail_policy_names_the_builtin():
    g = GuardedReward("format", REWARDS["format"], {"pattern": EVIL}, timeout_s=1.0)
    try:
        with pytest.raises(RewardFunctionError) as err:
            score(g, ["a" * 40 + "b"])
    finally:
        g.close()
    assert "timed out after 1 s" in str(err.value) and "builtin reward 'format'" in str(err.value)


# A "trainer" script: one reward worker that busy-loops forever (pure Python, or inside
# re holding the GIL), writing its pid first. The test kills the trainer.
TRAINER = """
import os, sys
from pathlib import Path
from danka.rewards.custom import load_reward_function
from danka.rewards.guard import GuardedReward
from danka.types import PromptRow
r = load_reward_function(sys.argv[1], Path("."))
g = GuardedReward("r", r, timeout_s=300, on_error="zero")
rows = [PromptRow(index=i, prompt="p", ground_truth="1") for i in range(50)]
print(g(rows, ["p"] * 50, ["x"] * 50).values)
"""

STUCK = """
import os, re, time

def _pid():
    with open(os.environ["DANKA_TEST_PIDS"], "w") as f:
        f.write(str(os.getpid()))

def busy(data_source, solution_str, ground_truth, extra_info=None):
    _pid()
    while True:
        pass

def in_regex(data_source, solution_str, ground_truth, extra_info=None):
    _pid()
    re.search(r"(a+)+$", "a" * 60 + "b")

def slow(data_source, solution_str, ground_truth, extra_info=None):
    _pid()
    time.sleep(0.05)
    return 1.0
"""


def start_trainer(tmp_path: Path, function: str) -> tuple[subprocess.Popen, int]:
    (tmp_path / "stuck.py").write_text(STUCK)
    (tmp_path / "trainer.py").write_text(textwrap.dedent(TRAINER))
    pids = tmp_path / "pids"
    env = {"PYTHONPATH": str(ROOT), "DANKA_TEST_PIDS": str(pids), "PATH": os.environ["PATH"]}
    trainer = subprocess.Popen(
        [sys.executable, str(tmp_path / "trainer.py"), f"{tmp_path}/stuck.py:{function}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return trainer, int(wait_for_file(pids))


@pytest.mark.parametrize("function", ["busy", "in_regex"])
def test_sigkilled_trainer_leaves_no_worker(tmp_path, function):
    if function == "in_regex" and not sys.platform.startswith("linux"):
        pytest.skip("a worker stuck in C code needs Linux's parent-death signal")
    trainer, worker = start_trainer(tmp_path, function)
    try:
        assert alive(worker)
        trainer.kill()  # SIGKILL: no atexit, no cleanup in the trainer
        trainer.wait(timeout=30)
        # before the fix the worker spun on at 100% CPU (forever when stuck in re)
        assert wait_dead(worker, 5.0), "the reward worker outlived the SIGKILLed trainer"
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_sigterm_to_the_trainer_gives_no_broken_pipe(tmp_path):
    trainer, worker = start_trainer(tmp_path, "slow")
    try:
        time.sleep(0.3)  # mid-batch: the worker is sending results
        trainer.send_signal(signal.SIGTERM)
        _, err = trainer.communicate(timeout=30)  # the worker shares the trainer's stderr
        assert wait_dead(worker, 5.0)
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)
    assert trainer.returncode == -signal.SIGTERM
    assert "BrokenPipe" not in err and "Traceback" not in err, err
