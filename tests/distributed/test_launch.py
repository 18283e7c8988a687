"""One rank fails: every rank ends promptly and the launcher exits with that rank's code.

Two gloo processes started by ``python -m danka.distributed.launch`` (torchrun's agent),
each running a small worker that handles errors the way ``danka``'s CLI does (UserError:
one line on stderr, exit ``err.exit_code``; anything else: traceback, exit 1), with
``dist.destroy()`` in a ``finally``. Every launch has a timeout: a hang fails the test.
The ``*_slow_exit`` modes make the failing rank's interpreter shutdown slow (an atexit
sleep), as CPU load does: its peer, failing on the aborted collective, then exits first.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from danka.distributed.launch import (
    FAILURE_DIR_ENV,
    exit_code,
    launcher_argv,
    read_failure,
    record_failure,
)
from danka.errors import UserError
from danka.step.guards import TrainingFault

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import atexit, sys, time
import torch
from danka import distributed as dist
from danka.errors import UserError
from danka.step.guards import TrainingFault

mode = sys.argv[1]
slow_exit = mode.endswith("_slow_exit")
mode = mode.removesuffix("_slow_exit")


def body():
    dist.init(torch.device("cpu"))
    assert dist.all_sum(1.0) == 2.0  # the group works
    if slow_exit and dist.rank() == 1:
        atexit.register(time.sleep, 20)  # a slow shutdown: the agent stops it (SIGTERM)
    if mode == "user_error" and dist.rank() == 1:
        raise UserError("row 7 has no answer", where="rows.jsonl:7", fix="add an answer")
    if mode == "crash" and dist.rank() == 1:
        raise RuntimeError("boom")
    if mode in ("user_error", "crash"):  # rank 0 goes on into a collective rank 1 never joins
        dist.all_sum(1.0)
        time.sleep(60)
    if mode == "hang":  # both ranks wait: the launcher itself is stopped
        print(f"rank {dist.rank()} ready", flush=True)
        time.sleep(60)
    if mode == "nan":  # rank 1's loss is NaN from step 2 on: both ranks skip the same steps
        bad_in_a_row = 0
        for step in range(1, 10):
            loss = torch.tensor(float("nan") if dist.rank() == 1 and step >= 2 else 0.5)
            ok = dist.all_finite(loss)  # before backward / the gradient sync
            bad_in_a_row = 0 if ok else bad_in_a_row + 1
            print(f"rank {dist.rank()} step {step} ok {ok}", flush=True)
            if bad_in_a_row >= 2:
                raise TrainingFault(f"{bad_in_a_row} steps in a row had a non-finite loss")
            dist.all_sum(1.0)  # stands in for the gradient sync


try:
    try:
        body()
    finally:
        dist.destroy()
except UserError as err:
    print(f"danka: error: {err}", file=sys.stderr)
    sys.exit(err.exit_code)
"""


def _launch(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "worker.py").write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    argv = launcher_argv(["--standalone", "--nproc-per-node=2", "worker.py", mode])
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return proc, time.perf_counter() - t0


def test_exit_code_prefers_the_rank_that_failed_by_itself():
    f = lambda code, ts: SimpleNamespace(exitcode=code, timestamp=ts)  # noqa: E731
    # rank 0 was stopped by the agent (SIGTERM = -15) in the same second rank 1 exited 2
    assert exit_code({0: f(-15, 100), 1: f(2, 100)}) == 2
    assert exit_code({0: f(3, 101), 1: f(2, 100)}) == 2  # the earlier one
    # on gloo the waiting rank fails too ("connection closed by peer", exit 1), maybe first
    assert exit_code({0: f(1, 99), 1: f(2, 100)}) == 2
    assert exit_code({0: f(1, 100), 1: f(-15, 99)}) == 1
    assert exit_code({0: f(-9, 100)}) == 128 + 9  # killed: shell convention
    assert exit_code({}) == 0


USER_ERROR = ["danka: error: rows.jsonl:7: row 7 has no answer", "fix: add an answer"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, code, once, tracebacks",
    [
        ("user_error", 2, USER_ERROR, 0),  # bad input: one message, no traceback at all
        ("user_error_slow_exit", 2, USER_ERROR, 0),
        ("crash", 1, ["RuntimeError: boom"], 1),  # a real bug keeps its traceback, once
        ("crash_slow_exit", 1, ["RuntimeError: boom"], 1),
    ],
)
def test_a_failure_on_one_rank_ends_both_with_one_report(tmp_path, mode, code, once, tracebacks):
    # _slow_exit: rank 0 fails on the aborted collective and exits 1 BEFORE rank 1 exits 2,
    # so the agent stops rank 1 (SIGTERM); the old launcher then exited 1 with rank 0's
    # "closed by peer" traceback (what CPU load did at random); the report decides now
    proc, seconds = _launch(tmp_path, mode)
    assert proc.returncode == code, proc.stderr[-3000:]
    for line in once:
        assert proc.stderr.count(line) == 1
    # none from rank 0, whose failure is a consequence, nor from the launcher
    assert proc.stderr.count("Traceback") == tracebacks
    assert "closed by peer" not in proc.stderr
    assert "ChildFailedError" not in proc.stderr and "distributed/run.py" not in proc.stderr
    assert seconds < 40  # rank 0 was stopped, not left waiting (it sleeps 60 s otherwise)


def test_the_first_report_wins_and_later_failures_are_consequences(tmp_path, monkeypatch):
    monkeypatch.delenv(FAILURE_DIR_ENV, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)  # the first attempt
    assert record_failure(UserError("bad"), rank=0) is None  # plain torchrun: not reported
    monkeypatch.setenv(FAILURE_DIR_ENV, str(tmp_path))
    assert read_failure(tmp_path) is None
    err = UserError("row 7 has no answer", where="rows.jsonl:7", fix="add an answer")
    assert record_failure(err, rank=1) is True
    assert record_failure(RuntimeError("connection closed by peer"), rank=0) is False
    report = read_failure(tmp_path)
    assert report["rank"] == 1 and report["exit_code"] == 2
    assert report["text"] == "danka: error: rows.jsonl:7: row 7 has no answer\n  fix: add an answer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failure.0.json"]  # no leftovers
    json.loads((tmp_path / "failure.0.json").read_text())  # complete JSON
    # torchrun --max-restarts: the restarted group's failure is a cause again, and is the
    # one the launcher reports
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert record_failure(TrainingFault("3 steps in a row had a non-finite loss"), rank=0)
    assert read_failure(tmp_path)["exit_code"] == 3
    # the folder is gone (a process outliving the launcher): nothing written, no error
    monkeypatch.setenv(FAILURE_DIR_ENV, str(tmp_path / "gone"))
    assert record_failure(UserError("bad"), rank=0) is None


def test_a_crash_report_is_its_traceback_with_code_1(tmp_path, monkeypatch):
    monkeypatch.setenv(FAILURE_DIR_ENV, str(tmp_path))
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        assert record_failure(exc, rank=0) is True
    report = read_failure(tmp_path)
    assert report["exit_code"] == 1
    assert report["text"].startswith("Traceback") and report["text"].endswith("RuntimeError: boom")


def test_nan_on_one_rank_is_skipped_by_all_then_fault_3(tmp_path):
    proc, _ = _launch(tmp_path, "nan")
    assert proc.returncode == 3, proc.stderr[-3000:]
    for r in (0, 1):  # the same decision on both ranks, step by step
        assert f"rank {r} step 1 ok True" in proc.stdout
        assert f"rank {r} step 2 ok False" in proc.stdout
        assert f"rank {r} step 3 ok False" in proc.stdout
        assert f"rank {r} step 4" not in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.xfail(
    strict=False,
    reason="flaky (2026-11-30: failed 3 of 7 runs on 2 idle cores): the launcher sometimes "
    "exits 0 after the workers' 60 s sleep, i.e. the SIGTERM sent right after both ranks "
    "print 'ready' is not acted on by torch's elastic agent; cause not found yet",
)
def test_sigterm_to_the_launcher_stops_every_rank(tmp_path):
    """What a forwarded Ctrl-C / scheduler SIGTERM does: exit 128 + 15, no rank left over."""
    (tmp_path / "worker.py").write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    argv = launcher_argv(["--standalone", "--nproc-per-node=2", "worker.py", "hang"])
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    seen = 0
    for line in proc.stdout:  # wait until both ranks are up
        seen += "ready" in line
        if seen == 2:
            break
    t0 = time.perf_counter()
    proc.terminate()
    assert proc.wait(timeout=60) == 128 + 15
    assert time.perf_counter() - t0 < 40  # not the workers' 60 s sleep
