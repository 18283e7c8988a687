"""How many CPU threads torch computes with (``speed.cpu_threads``): a good neighbour on a
shared CPU, without giving up runs that repeat bit for bit.

torch starts one thread per core it sees. Two such processes on 2 cores run 4 busy threads
on 2 cores, and each OpenMP barrier waits for a thread that is not running: a quickstart
step measured 150-321 s beside another torch job instead of 21.8 s alone. ``auto`` counts
the CPUs this process may use (``os.sched_getaffinity``, capped by ``OMP_NUM_THREADS``
when set and by a cgroup CPU quota: ``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in v1).
The thread count changes a CPU run's numbers in their last bits (reductions split
differently), so ``auto`` does not follow the load: a resumed run must repeat the
uninterrupted one, and the same config the same numbers. Sharing is done by how the
threads wait instead (models/openmp_wait: they sleep when another process computes beside
the run, which changes no number). After each step the load is read again (the 1-minute
load average, ``os.getloadavg``, less this process's own threads): when others keep a CPU
busy while this run's threads spin (it started alone), one line says that a resume
shares better (:class:`ThreadGovernor`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CpuShare:
    """What ``auto`` saw and chose."""

    cpus: int  # CPUs this process may run on (affinity; OMP_NUM_THREADS when lower)
    quota: float | None  # the cgroup's CPU quota in CPUs (None: none)
    load: float  # 1-minute load average of the machine
    own: int  # threads of this process counted in the load (0 before it computes)
    threads: int  # the choice
    busy: int = 0  # CPUs the load says others keep busy (0: none)

    @property
    def usable(self) -> int:
        return min(self.cpus, max(1, math.ceil(self.quota))) if self.quota else self.cpus

    def line(self) -> str:
        """``cpu threads: 2 (speed.cpu_threads: auto; 2 CPUs usable, load 0.3)``."""
        quota = f", cgroup quota {self.quota:g} CPUs" if self.quota else ""
        return (
            f"cpu threads: {self.threads} (speed.cpu_threads: auto; {self.cpus} CPUs usable"
            f"{quota}, load {self.load:.1f})"
        )

    def crowded(self) -> str | None:
        """The one-line advice when others keep CPUs busy, else None."""
        if not self.busy:
            return None
        return (
            f"cpu threads: load {self.load:.1f}, others keep ~{self.busy} of {self.usable} CPUs "
            "busy while this run's threads spin-wait (it started alone): stop it (Ctrl-C) and "
            "`--resume auto` to share them (a resumed run repeats this one bit for bit; its "
            "threads then sleep while they wait)"
        )


def cgroup_cpu_quota(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (v2 ``cpu.max`` "200000 100000" ->
    2.0; v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None without one."""
    candidates = [root / "cpu.max"]
    try:  # cgroup v2 outside a container: /proc/self/cgroup says "0::/user.slice/..."
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::/") and len(line) > 4:
                candidates.insert(0, root / line[4:] / "cpu.max")
    except OSError:
        pass
    for path in candidates:
        try:
            quota, period = path.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity
        return os.cpu_count() or 1


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def share(
    own: int = 0,
    *,
    cpus: int | None = None,
    quota: float | None | str = "read",
    load: float | None = None,
) -> CpuShare:
    """The ``auto`` choice: the usable CPUs (at least 1), and how many the load says others
    keep busy. ``own``: threads of this process already in the load average. The machine
    is read for what is not given (tests give all three)."""
    cpus = _affinity() if cpus is None else cpus
    cap = os.environ.get("OMP_NUM_THREADS", "")
    if cap.isdigit() and int(cap) > 0:  # the user's (or torchrun's, 1 per rank) limit
        cpus = min(cpus, int(cap))
    quota = cgroup_cpu_quota() if quota == "read" else quota
    load = _load() if load is None else load
    usable = CpuShare(cpus, quota, load, own, 0).usable
    busy = min(usable - 1, math.floor(max(0.0, load - own) + 0.3))  # from ~0.7 of a core
    return CpuShare(cpus, quota, load, own, max(1, usable), max(0, busy))


def use_cpu_threads(setting: int | str, device: str, log) -> ThreadGovernor:
    """Set torch's thread count as ``speed.cpu_threads`` (validated: ``auto`` or a count)
    says and log it in one line; returns the governor that looks again after each step
    (a no-op for a count). ``auto`` on a GPU (``device``: model.device) leaves torch's
    default: the CPU only feeds the GPU there."""
    import torch

    from danka.models import openmp_wait
    from danka.models.loading import pick_device

    before = torch.get_num_threads()
    waits = openmp_wait.CHOSEN  # None: a Python caller (torch loaded before danka chose)
    if waits is not None:
        log(waits.line())

    if setting == "auto" and pick_device(device).type != "cpu":
        return ThreadGovernor(log, watch=False, threads=before, before=before)
    if setting != "auto":
        torch.set_num_threads(int(setting))
        log(f"cpu threads: {setting} (speed.cpu_threads)")
        return ThreadGovernor(log, watch=False, threads=int(setting), before=before)
    chosen = share()
    torch.set_num_threads(chosen.threads)
    log(chosen.line())
    # advised only where a resume would change the wait: danka chose to spin (or could not
    # choose), not where the threads sleep already or the user set the policy
    watch = waits is None or (waits.policy == "active" and not waits.user)
    gov = ThreadGovernor(log, watch=watch, threads=chosen.threads, before=before)
    if waits is None:  # otherwise the choice just looked at the CPU, more currently
        gov.advise(chosen)
    return gov


@dataclass
class ThreadGovernor:
    """After each training step (a callback's ``on_step``), when ``watch`` (``auto`` with
    threads danka let spin), the load read again; when others keep CPUs busy, one line (once a run) says
    that a resume shares them better. The count itself stays (module docstring)."""

    log: object
    watch: bool
    threads: int
    before: int = 0  # torch's count before the run: a Python caller gets it back (restore)
    advised: bool = False

    def advise(self, now: CpuShare) -> None:
        if self.advised or (advice := now.crowded()) is None:
            return
        self.log(advice)
        self.advised = True

    def on_step(self, step: int, metrics: dict) -> None:
        if self.watch and not self.advised:
            self.advise(share(own=self.threads))

    def restore(self) -> None:
        import torch

        if self.before:
            torch.set_num_threads(self.before)
