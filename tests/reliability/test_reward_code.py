"""User reward code that exits, hangs, fails or forks at import, or leaves detached
processes behind: ``danka train`` as a real process. The reward file is imported only in
its worker process, under the worker's time limit; what it started dies with the worker;
a run never exits 0 when its reward code could not be loaded."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest

from danka.rewards.custom import load_reward_function
from danka.rewards.guard import GuardedReward
from danka.types import PromptRow

from .conftest import (
    assert_user_error,
    child_env,
    danka,
    one_step_config,
    processes_with,
    wait_until,
)

REWARD = "def reward(prompts, completions, **columns):\n    return [0.5 for _ in completions]\n"


def _train_with_reward(tmp_path, model_dir, top: str, *extra: str, timeout: float = 300):
    config = one_step_config(tmp_path, model_dir)
    (tmp_path / "reward.py").write_text(textwrap.dedent(top) + REWARD)
    return danka("train", str(config), *extra, timeout=timeout)


@pytest.mark.parametrize("exit_call", ["import os; os._exit(0)", "import sys; sys.exit(0)"])
def test_a_reward_file_that_exits_at_import_fails_the_run(tmp_path, model_dir, exit_call):
    """Before: os._exit(0) at import ran in the trainer: exit 0, nothing trained."""
    done = _train_with_reward(tmp_path, model_dir, exit_call + "\n")
    assert_user_error(
        done, "reward.py", "nothing was scored" if "_exit" in exit_call else "SystemExit"
    )
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
    assert "danka: error:" in (tmp_path / "out" / "logs" / "train.log").read_text()


def test_a_reward_file_that_hangs_at_import_is_stopped_by_the_load_limit(tmp_path, model_dir):
    """Before: the sleep ran in the trainer, unbounded (over 300 s, no message)."""
    done = _train_with_reward(
        tmp_path, model_dir, "import time; time.sleep(600)\n", "reward.timeout_s=1", timeout=240
    )
    assert_user_error(done, "reward.py", "took over 10 s", "reward.timeout_s")
    assert done.seconds < 200


def test_a_syntax_error_names_the_line(tmp_path, model_dir):
    done = _train_with_reward(tmp_path, model_dir, "x = 1\nif x\n    pass\n")
    assert_user_error(done, f"{tmp_path / 'reward.py'}:2", "SyntaxError", "if x")


DETACHED = """
import os, subprocess, sys
MARK = os.environ["DANKA_TEST_MARK"]
# a daemon in its own session, started at import and again by every call
def _spawn():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", MARK],
                     start_new_session=True)
_spawn()
if os.fork() == 0:  # a double-forked grandchild: its parent exits at once
    if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", MARK])
    os._exit(0)

def reward(prompts, completions, **columns):
    _spawn()
    return [0.5 for _ in completions]
"""


def test_detached_grandchildren_of_a_reward_end_with_the_run(tmp_path, model_dir):
    """Before: a reward that started setsid children left them running after exit 0."""
    mark = f"danka-reliability-{os.getpid()}-{time.monotonic_ns()}"
    config = one_step_config(tmp_path, model_dir)
    (tmp_path / "reward.py").write_text(DETACHED)
    try:
        done = danka("train", str(config), env=child_env(DANKA_TEST_MARK=mark))
        assert done.returncode == 0, done.out[-3000:]
        survivors = processes_with(mark)
        assert wait_until(lambda: not processes_with(mark), 5.0), f"still running: {survivors}"
    finally:
        for pid in processes_with(mark):
            os.kill(pid, signal.SIGKILL)


def test_close_ends_a_detached_grandchild_of_the_worker(tmp_path, monkeypatch):
    mark = f"danka-reliability-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("DANKA_TEST_MARK", mark)  # the worker inherits it
    (tmp_path / "reward.py").write_text(DETACHED)
    reward = load_reward_function("reward.py:reward", tmp_path)
    g = GuardedReward("r", reward)
    try:
        rows = [PromptRow(index=0, prompt="p", ground_truth="1")]
        assert g(rows, ["p"], ["x"]).values == [0.5]
        assert wait_until(lambda: len(processes_with(mark)) >= 3, 10.0)  # import x2, call x1
        g.close()
        assert wait_until(lambda: not processes_with(mark), 5.0), processes_with(mark)
    finally:
        g.close()
        for pid in processes_with(mark):
            os.kill(pid, signal.SIGKILL)


def test_a_reward_file_that_forks_at_import_and_hangs_is_stopped(tmp_path):
    """A child forked at import keeps the worker's pipe open; the limit still holds, and
    the child is killed with the worker."""
    mark = f"danka-reliability-{os.getpid()}-{time.monotonic_ns()}"
    (tmp_path / "reward.py").write_text(
        f"import os, sys, time\nif os.fork() == 0:\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', {mark!r}])\n"
        "time.sleep(600)\n" + REWARD
    )
    t0 = time.monotonic()
    with pytest.raises(Exception, match="took over 10 s"):
        load_reward_function("reward.py:reward", tmp_path, timeout_s=1)
    assert time.monotonic() - t0 < 60
    assert wait_until(lambda: not processes_with(mark), 5.0), processes_with(mark)
