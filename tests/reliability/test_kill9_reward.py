"""``kill -9`` of ``danka train`` while a reward call runs a subprocess: the reward worker
and everything it started die with the trainer (the worker's guardian process ends them;
danka/usercode/worker.py), a detached (``setsid``) one included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .conftest import REPO, child_env, one_step_config, processes_with, wait_until

REWARD = """
import os, subprocess, sys
MARK = os.environ["DANKA_TEST_MARK"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(300)", MARK]

def reward(prompts, completions, **columns):
    subprocess.Popen(SLEEP, start_new_session=True)  # a detached one
    subprocess.run(SLEEP)  # the call in progress when the trainer is killed
    return [0.5 for _ in completions]
"""


def test_kill_9_of_the_trainer_ends_what_the_reward_started(tmp_path, model_dir):
    """Before: the worker died by its parent-death signal, but the `sleep` its reward call
    ran was still alive 3 s after the kill (and forever after)."""
    mark = f"danka-kill9-{os.getpid()}-{time.monotonic_ns()}"
    config = one_step_config(tmp_path, model_dir)
    (tmp_path / "reward.py").write_text(REWARD)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "danka", "train", str(config)],
        cwd=REPO,
        env=child_env(DANKA_TEST_MARK=mark),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: len(processes_with(mark)) >= 2, 240), "no reward call"
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        assert wait_until(lambda: not processes_with(mark), 3.0), processes_with(mark)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        for pid in processes_with(mark):
            os.kill(pid, signal.SIGKILL)
