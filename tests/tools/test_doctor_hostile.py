"""``danka doctor RUN_DIR`` on run folders someone tampered with: a named pipe, a folder, a
symlink loop or a device where a file belongs, text that is not UTF-8, JSON nested 100k
levels deep, a 250k-step metrics.jsonl. Each is one message and exit 2 (or a verdict),
within seconds; never a hang or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danka.cli import main

REPO = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000


def _run_dir(root: Path) -> Path:
    run = root / "run"
    (run / "eval").mkdir(parents=True)
    (run / "completions").mkdir()
    (run / "config.json").write_text(json.dumps({"model": {}}))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    return run


def _doctor(run: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "danka", "doctor", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("name", ["config.json", "eval/step_1.json", "metrics.jsonl",
                                  "completions/step_1.jsonl"])  # fmt: skip
def test_a_named_pipe_in_the_run_folder_is_refused_without_blocking(tmp_path, name):
    """Before: read_text() on the pipe blocked forever (a scheduler's doctor wedged)."""
    run = _run_dir(tmp_path)
    (run / name).unlink(missing_ok=True)
    os.mkfifo(run / name)
    done = _doctor(run, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "named pipe" in done.stderr and name.split("/")[-1] in done.stderr
    assert "fix:" in done.stderr and "Traceback" not in done.stderr


def _replace(path: Path, how: str) -> None:
    path.unlink(missing_ok=True)
    if how == "folder":
        path.mkdir()
    elif how == "loop":
        path.symlink_to(path.name)  # points at itself
    elif how == "device":
        path.symlink_to("/dev/zero")
    elif how == "not utf-8":
        path.write_bytes(b'{"model": "caf\xe9"}')
    elif how == "deep":
        path.write_text(DEEP)


@pytest.mark.parametrize("how", ["folder", "loop", "device", "not utf-8", "deep"])
@pytest.mark.parametrize("name", ["config.json", "eval/step_1.json"])
def test_a_damaged_json_file_is_one_message_and_exit_2(tmp_path, capsys, name, how):
    """Before: IsADirectoryError, FileNotFoundError, UnicodeDecodeError, RecursionError
    tracebacks (exit 1); /dev/zero never ended."""
    run = _run_dir(tmp_path)
    _replace(run / name, how)
    assert main(["doctor", str(run)]) == 2
    err = capsys.readouterr().err
    assert name.split("/")[-1] in err and "fix:" in err, err


@pytest.mark.parametrize("how", ["folder", "loop", "device"])
def test_a_metrics_file_that_is_no_file_is_refused(tmp_path, capsys, how):
    run = _run_dir(tmp_path)
    _replace(run / "metrics.jsonl", how)
    assert main(["doctor", str(run)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_deep_json_lines_in_metrics_and_completions_are_skipped_like_broken_lines(tmp_path, capsys):
    run = _run_dir(tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(DEEP + "\n" + '{"step": 2, "reward": 0.5}\n')
    (run / "completions" / "step_1.jsonl").write_text(DEEP + "\n" + '{"prompt": "p"}\n')
    assert main(["doctor", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 2


def test_a_250k_step_metrics_file_gets_a_verdict_in_seconds(tmp_path):
    """Before: every check re-read every step up to each step (quadratic): no verdict in
    120 s on a long run's own metrics. The entropy collapses at step 200000."""
    run = _run_dir(tmp_path)
    line = '{{"step": {}, "reward": 0.5, "response_length": 100, "actor/entropy": {}}}\n'
    with open(run / "metrics.jsonl", "w") as f:
        f.writelines(line.format(s, 2.0 if s < 200_000 else 0.01) for s in range(1, 250_001))
    t0 = time.monotonic()
    done = _doctor(run, timeout=90)
    assert done.returncode == 1, done.stderr
    assert "250000 steps" in done.stdout and "entropy_collapse (step 2000" in done.stdout
    assert time.monotonic() - t0 < 60


def test_integers_past_floats_range_are_ignored_not_a_traceback(tmp_path, capsys):
    """A 4000-digit integer is valid JSON; float() of it overflows (an OverflowError)."""
    run = _run_dir(tmp_path)
    big = 10**4000
    lines = [json.dumps({"step": s, "reward": 0.5, "response_length": big}) for s in (1, 2)]
    (run / "metrics.jsonl").write_text("\n".join([*lines, f'{{"step": {big}}}']) + "\n")
    (run / "eval" / "step_0.json").write_text(f'{{"eval/accuracy": {big}, "eval/n": {big}}}')
    assert main(["doctor", str(run)]) == 0
    assert "2 steps" in capsys.readouterr().out
    assert main(["plot", str(run)]) == 0
