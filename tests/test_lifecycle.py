"""One run per output dir (real processes), stop on SIGTERM/SIGINT at a safe point, exit codes,
signal forwarding to a launched child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from danka.errors import UserError
from danka.lifecycle import (
    LOCK_NAME,
    RANKS_LOCK_NAME,
    RankLock,
    RunLock,
    StopRequest,
    run_forwarding_signals,
)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_line(proc: subprocess.Popen, word: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if word in line:
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"{word!r} never printed; stderr: {proc.stderr.read()}")


HOLD_LOCK = """
import sys, time
from danka.lifecycle import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_second_live_run_is_refused_naming_the_pid(tmp_path):
    holder = _spawn(HOLD_LOCK, str(tmp_path))
    try:
        _wait_line(holder, "locked")
        with pytest.raises(UserError) as err:
            RunLock(tmp_path).acquire()
        assert f"pid {holder.pid}" in str(err.value) and err.value.exit_code == 2
        # the CLI: a second `danka train` on the same output dir exits 2 before any model load
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "model: {actor_model_name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct}\n"
            "data: {task: arithmetic}\n"
        )
        second = subprocess.run(
            [sys.executable, "-m", "danka", "train", str(cfg), "--output_dir", str(tmp_path)],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        assert f"another danka run (pid {holder.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        assert not (tmp_path / "logs").exists()  # it wrote nothing
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_files_follow_the_one_file_mode_rule(tmp_path):
    """The locks in a run folder are files a run writes: the umask alone sets their mode,
    as for every other file (0664 under a group-sharing umask 002, not a fixed 0644)."""
    from danka.io import new_file_mode

    old = os.umask(0o002)
    try:
        with RunLock(tmp_path), RankLock(tmp_path):
            modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
        assert new_file_mode() == 0o664
    finally:
        os.umask(old)
    assert modes == {LOCK_NAME: 0o664, RANKS_LOCK_NAME: 0o664}


def test_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = _spawn(HOLD_LOCK, str(tmp_path))
    _wait_line(holder, "locked")
    holder.send_signal(signal.SIGKILL)  # dies holding it: the file with its pid stays
    holder.wait()
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(holder.pid)
    with caplog.at_level("WARNING", logger="danka.lifecycle"):
        with RunLock(tmp_path) as lock:
            assert lock.took_over == holder.pid
            assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    assert f"taking over the run lock of pid {holder.pid} (no longer running)" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()  # a clean exit leaves no lock file
    with RunLock(tmp_path):  # and the next run takes it silently
        pass


LOOP = """
import sys, time
from danka.lifecycle import StopRequest
saved = None
try:
    with StopRequest() as stop:
        for step in range(1, 100000):
            time.sleep(0.01)  # one training step
            if stop.requested:  # the safe point after a step
                saved = step
                if sys.argv[1] == "slow-save":
                    print("saving", flush=True)
                    time.sleep(60)
                break
            if step == 1:
                print("ready", flush=True)  # the loop polls from here on
    print(f"saved checkpoint {saved}, exit {stop.exit_code}", flush=True)
    sys.exit(stop.exit_code)
except KeyboardInterrupt:
    print("aborted without saving", flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_sets_the_flag_and_the_loop_saves_then_exits(sig, code):
    proc = _spawn(LOOP, "fast")
    _wait_line(proc, "ready")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"exit {code}" in out and "saved checkpoint" in out
    assert "saving a checkpoint after this step" in err  # the warning says what happens


def test_second_ctrl_c_aborts_at_once():
    proc = _spawn(LOOP, "slow-save")
    _wait_line(proc, "ready")
    proc.send_signal(signal.SIGINT)
    _wait_line(proc, "saving")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "aborted without saving" in out
    assert time.monotonic() - t0 < 20  # not after the 60 s "save"


NO_POLL = """
import time
from danka.lifecycle import StopRequest
with StopRequest():
    print("ready", flush=True)
    time.sleep(60)  # model loading, or a loop that never reads stop.requested
"""


def test_signal_before_the_loop_polls_exits_at_once():
    """Never swallowed: nothing to save yet, so SIGTERM ends the process with 143."""
    proc = _spawn(NO_POLL)
    _wait_line(proc, "ready")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143 and time.monotonic() - t0 < 20


def test_stop_request_restores_the_old_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        assert not stop.requested and stop.exit_code == 0
        stop._handle(signal.SIGTERM, None)  # after a poll: only the flag
        assert stop.requested and stop.exit_code == 143 and stop.name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == before


FORWARD = """
import sys
from danka.lifecycle import run_forwarding_signals
child = "import signal, sys, time\\n" \\
    "signal.signal(signal.SIGTERM, lambda *a: (print('child got SIGTERM', flush=True), " \\
    "sys.exit(143)))\\nprint('child ready', flush=True)\\ntime.sleep(60)"
sys.exit(run_forwarding_signals([sys.executable, "-c", child]))
"""


def test_launcher_forwards_sigterm_to_its_child():
    """`danka train --nproc N` runs torchrun this way: a scheduler's SIGTERM reaches it."""
    proc = _spawn(FORWARD)
    _wait_line(proc, "child ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "child got SIGTERM" in out, err
    assert proc.returncode == 143


def test_child_killed_by_a_signal_maps_to_128_plus_signal():
    code = run_forwarding_signals([sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"])
    assert code == 143
