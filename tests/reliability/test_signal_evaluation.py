"""SIGTERM while ``danka train`` evaluates: during the last evaluation the run finishes it,
saves and exits 143 saying so; during the step-0 evaluation (before any step, nothing to
save) it stops at once and train.log says why. Never a silent death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import REPO, child_env, one_step_config, running, wait_until

# Test hook: the evaluation stage (danka.step.heldout.Evaluator) at step DANKA_TEST_EVAL_STEP writes a marker, then sleeps.
HOOK = """
import importlib.abc, importlib.util, os, sys, time
_MARK, _STEP = os.environ.get("DANKA_TEST_EVAL_MARK"), os.environ.get("DANKA_TEST_EVAL_STEP")

class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "danka.step.heldout":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(m):
            run(m)
            real = m.Evaluator.__call__

            def slow(self, step, *a, **kw):
                if step == int(_STEP):
                    open(_MARK, "w").write("x")
                    time.sleep(8)
                return real(self, step, *a, **kw)

            m.Evaluator.__call__ = slow

        spec.loader.exec_module = exec_module
        return spec

if _MARK:
    sys.meta_path.insert(0, _Hook())
"""


@pytest.mark.parametrize("step, said", [(2, "stopped after step 2 (checkpoint saved)"),
                                        (0, "before the first step ended")])  # fmt: skip
def test_sigterm_during_an_evaluation_exits_143_and_says_so(tmp_path, model_dir, step, said):
    config = one_step_config(tmp_path, model_dir, trainer={"total_steps": 2},
                             data={"train_dataset": "rows.jsonl", "eval_size": 2})  # fmt: skip
    hook, mark, out = tmp_path / "hook", tmp_path / "evaluating", tmp_path / "out"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    env = child_env(DANKA_TEST_EVAL_MARK=str(mark), DANKA_TEST_EVAL_STEP=str(step))
    env["PYTHONPATH"] = f"{hook}{os.pathsep}{REPO}"
    cmd = [sys.executable, "-m", "danka", "train", str(config), "--output-dir", str(out)]
    with running(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        assert wait_until(mark.exists, 240), "never evaluated"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, text[-3000:]
    assert "Traceback" not in text
    assert said in (out / "logs" / "train.log").read_text()
