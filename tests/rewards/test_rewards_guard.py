"""Calling reward functions safely: hangs, exceptions, None and NaN under each on_error."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from danka.errors import UserError
from danka.rewards.builtin import REWARDS
from danka.rewards.custom import load_reward_function
from danka.rewards.guard import GuardedReward, RewardFunctionError
from danka.types import PromptRow

# One verl-style function whose behaviour is picked by the completion text.
VERL_CODE = """
import math, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(10**6)
    if solution_str == "raise":
        raise ZeroDivisionError("division by zero in my reward")
    if solution_str == "none":
        return None
    if solution_str == "nan":
        return math.nan
    return 1.0
"""

TRL_CODE = """
def batched(prompts, completions, ground_truth, **kwargs):
    if "raise" in completions:
        raise KeyError("no such column")
    return [None if c == "none" else float(c == g) for c, g in zip(completions, ground_truth)]
"""


@pytest.fixture(scope="module")
def verl_reward(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "behaviour.py"
    path.write_text(VERL_CODE)
    return load_reward_function(f"{path}:compute_score", Path("."))


def rows(n):
    return [PromptRow(index=10 + i, prompt=f"prompt {i}", ground_truth="1") for i in range(n)]


def score(guarded, completions):
    rs = rows(len(completions))
    return guarded(rs, [r.prompt for r in rs], completions)


@pytest.fixture(scope="module")
def zero(verl_reward):
    g = GuardedReward("behaviour", verl_reward, timeout_s=1.0, on_error="zero")
    yield g
    g.close()


def test_zero_policy_hang_raise_none_nan(zero):
    # a hung call is killed after 1 s, the worker restarts and serves the later samples
    got = score(zero, ["ok", "hang", "ok", "raise", "none", "nan", "ok"])
    assert got.values == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert got.valid == [True] * 7
    assert got.num_errors == 4
    # the restarted worker keeps working
    assert score(zero, ["ok", "ok"]).values == [1.0, 1.0]


def test_skip_sample_policy(verl_reward):
    g = GuardedReward("behaviour", verl_reward, timeout_s=1.0, on_error="skip_sample")
    try:
        got = score(g, ["ok", "raise", "none", "nan", "hang"])
    finally:
        g.close()
    assert got.values == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert got.valid == [True, False, False, False, False]
    assert got.num_errors == 4


@pytest.mark.parametrize(
    "completion, words",
    [
        ("raise", ["ZeroDivisionError", "division by zero in my reward", "compute_score"]),
        ("none", ["returned None"]),
        ("nan", ["returned NaN"]),
        ("hang", ["timed out after 0.5 s"]),
    ],
)
def test_fail_policy_shows_sample_function_traceback(verl_reward, completion, words):
    g = GuardedReward("behaviour", verl_reward, timeout_s=0.5, on_error="fail")
    try:
        with pytest.raises(RewardFunctionError) as err:
            score(g, ["ok", completion])
    finally:
        g.close()
    msg = str(err.value)
    assert isinstance(err.value, UserError)
    assert "behaviour.py:compute_score" in msg  # the function
    assert "completion 1 (data row 11)" in msg and "'prompt 1'" in msg  # the sample
    assert f"completion: '{completion}'" in msg
    assert "on_error" in msg  # the fix
    for word in words:
        assert word in msg


def test_trl_batched_function(tmp_path):
    path = tmp_path / "trl_reward.py"
    path.write_text(TRL_CODE)
    reward = load_reward_function(f"{path}:batched", tmp_path)
    g = GuardedReward("batched", reward, timeout_s=5.0, on_error="skip_sample")
    try:
        # None = "does not apply to this sample" (TRL): not an error, not skipped
        got = score(g, ["1", "2", "none"])
        assert got.values == [1.0, 0.0, 0.0] and got.valid == [True, True, True]
        assert got.applies == [True, True, False] and got.num_errors == 0
        # an exception in a batched call fails every sample of the batch
        got = score(g, ["1", "raise"])
        assert got.valid == [False, False] and got.num_errors == 2
        g.on_error = "fail"  # the default: None still does not stop the run
        assert score(g, ["none", "1"]).applies == [False, True]
    finally:
        g.close()


def test_builtin_runs_in_the_worker_with_policy():
    # the length reward without kwargs raises ValueError: a crash, handled like any other
    g = GuardedReward("length", REWARDS["length"], {}, on_error="zero")
    got = score(g, ["abc"])
    assert got.values == [0.0] and got.num_errors == 1
    g = GuardedReward("length", REWARDS["length"], {"max_chars": 2})
    assert score(g, ["abc"]).values == [-0.5]  # -min(1, (3-2)/2)


def test_bad_policy():
    with pytest.raises(UserError, match="skip_sample"):
        GuardedReward("x", REWARDS["gsm8k"], on_error="ignore")


def test_process_exits_with_a_worker_stuck_forever(tmp_path):
    # A script whose reward hangs: the call times out, and the script exits although a
    # worker was alive (atexit kills it). Guarded by subprocess's timeout, not a timing
    # assertion: failure here means the interpreter hung at exit.
    (tmp_path / "hang.py").write_text(VERL_CODE)
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from danka.rewards.custom import load_reward_function
            from danka.rewards.guard import GuardedReward
            from danka.types import PromptRow
            r = load_reward_function("hang.py:compute_score", Path({str(tmp_path)!r}))
            g = GuardedReward("h", r, timeout_s=0.5, on_error="zero")
            rows = [PromptRow(index=0, prompt="p", ground_truth="1")] * 2
            print(g(rows, ["p", "p"], ["hang", "ok"]).values)
            """
        )
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=root,
        env={"PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 1.0]"
