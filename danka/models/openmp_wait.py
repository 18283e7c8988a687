"""How torch's OpenMP threads wait on a shared CPU: spin when the run is alone, sleep when
another process computes beside it.

torch's CPU build runs its parallel loops on GNU OpenMP, whose threads spin at the end of
each loop waiting for the next (``OMP_WAIT_POLICY`` unset: active). Alone that is the
fastest way to wait; beside another computing process the spinning threads take the CPU
the other one's threads need, and every barrier waits for a thread that is not running.
Measured on a 2-core machine (quickstart, 2 steps, 24 held-out problems, 2 threads each):
alone 61 s spinning, 93 s sleeping (``passive``); two side by side 419 s each spinning,
112 s each sleeping, one of each 161 s / 117 s. The policy does not change a single
number (only how a thread waits), so choosing it by the machine's state keeps every run
bit-for-bit repeatable, which choosing the thread count by load does not (models/threads).

libgomp reads ``OMP_WAIT_POLICY`` once, when torch loads it, so the choice is made before
the first ``import torch`` of a computing command (``danka train``, ``eval``...):

* the user's own ``OMP_WAIT_POLICY`` is kept;
* each computing danka process writes its pid into a folder of this user's (removed at
  exit); one started in the same instant as another registers, waits a moment
  (``SETTLE_S``) and then sees it, so both sleep;
* other busy processes: the running-task count of ``/proc/loadavg`` (now, not the
  1-minute average, which still counts a run that just ended), the fewest of 5 reads over
  the moment (a computing process runs in every read; a kernel thread's blip in one).

A run started alone keeps spinning when another starts later (the policy cannot change in
a running process); its one-line advice says a resume (``--resume auto``, bit-identical)
shares the CPUs better.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from danka.lifecycle import pid_alive

WAIT_ENV = "OMP_WAIT_POLICY"
SETTLE_S = 0.5  # a run started in the same instant registers within this (Python start-up)
SAMPLES = 5  # reads of /proc/loadavg over SETTLE_S; the fewest seen counts the busy tasks


@dataclass(frozen=True)
class WaitChoice:
    """What was chosen and why, for the run's log."""

    policy: str  # "active" (spin: libgomp's default), "passive" (sleep), or the user's value
    why: str
    user: bool = False  # OMP_WAIT_POLICY was set before danka looked: danka leaves it

    def line(self) -> str:
        return f"OpenMP threads wait {self.policy} ({self.why})"


CHOSEN: WaitChoice | None = None  # this process's choice, set by choose() on os.environ


def registry_dir() -> Path:
    """This user's folder of computing danka processes (one file per pid)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"danka-{uid}" / "cpu-runs"


def register(folder: Path, pid: int | None = None) -> Path | None:
    """Write ``folder/<pid>``; removed when this process exits. None where the folder
    cannot be written (then others do not see this run: it only costs sharing)."""
    pid = os.getpid() if pid is None else pid
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        entry = folder / str(pid)
        entry.write_text("", encoding="utf-8")
    except OSError:
        return None
    atexit.register(_unlink, entry)
    return entry


def _unlink(entry: Path) -> None:
    try:
        entry.unlink()
    except OSError:
        pass


def other_runs(folder: Path, pid: int | None = None, alive: Callable = pid_alive) -> int:
    """Live danka processes registered besides ``pid``; stale entries are removed."""
    pid = os.getpid() if pid is None else pid
    try:
        entries = [p for p in folder.iterdir() if p.name.isdigit()]
    except OSError:
        return 0
    count = 0
    for entry in entries:
        if int(entry.name) == pid:
            continue
        if alive(int(entry.name)):
            count += 1
        else:
            _unlink(entry)
    return count


def running_tasks() -> int | None:
    """Tasks running or runnable now (``/proc/loadavg``'s 4th field, "2/110" -> 2; the
    reader counts itself); None without /proc."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def choose() -> WaitChoice | None:
    """Choose for this process (``os.environ``), before torch loads; remembered in
    ``CHOSEN`` for the run's log."""
    global CHOSEN
    CHOSEN = decide(os.environ, torch_loaded="torch" in sys.modules, folder=registry_dir())
    return CHOSEN


def decide(
    env: dict,
    *,
    torch_loaded: bool,
    folder: Path,
    settle_s: float = SETTLE_S,
    tasks: Callable[[], int | None] = running_tasks,
    sleep: Callable[[float], None] = time.sleep,
) -> WaitChoice | None:
    """Set ``OMP_WAIT_POLICY`` in ``env``; None where it can no longer matter (torch
    already loaded: libgomp has read the environment)."""
    if torch_loaded:
        return None
    if env.get(WAIT_ENV):
        return WaitChoice(env[WAIT_ENV].lower(), f"{WAIT_ENV} set", user=True)
    register(folder)
    counts = []
    for _ in range(SAMPLES):
        sleep(settle_s / SAMPLES)
        if (n := tasks()) is not None:
            counts.append(max(0, n - 1))  # less the reader itself
    busy = min(counts, default=0)  # a computing process runs in every read, a blip in one
    others = other_runs(folder)
    if others or busy:
        env[WAIT_ENV] = "PASSIVE"
        said = [f"{others} other danka run{'s' * (others > 1)}"] if others else []
        said += [f"{busy} other busy task{'s' * (busy > 1)}"] if busy else []
        return WaitChoice("passive", f"shared CPU: {', '.join(said)}")
    return WaitChoice("active", "alone on the CPU")
