"""Process trees of user code: find every descendant of a worker, and end them all.

Why this exists: a reward or tool worker runs in its own session and process group, and a
timeout or ``close`` SIGKILLs that group. A process the user's code started with
``setsid`` (a daemon, ``subprocess.Popen(start_new_session=True)``, a double fork) leaves
the group and survived the run. So a worker makes itself a *child subreaper* (Linux
``prctl(PR_SET_CHILD_SUBREAPER)``): an orphaned descendant is re-parented to the worker
instead of to init, the tree stays connected through ``ppid`` links, and
:func:`kill_tree` finds it in ``/proc``. The tree is stopped (SIGSTOP) before it is killed,
so a process cannot fork a new child between the listing and the SIGKILL.

Standard library only (the reward worker imports it). Elsewhere than Linux the process
group kill is all there is.
"""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_PR_SET_PDEATHSIG = 1


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (Linux); True if set."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def set_parent_death_signal(sig: int) -> bool:
    """The kernel sends ``sig`` to this process when its parent (thread) dies (Linux)."""
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def _parents() -> dict[int, int]:
    """pid -> ppid of every process ``/proc`` shows (empty where there is no ``/proc``)."""
    out: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def children(pid: int) -> list[int]:
    """The live direct children of ``pid``."""
    return [child for child, parent in _parents().items() if parent == pid]


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, grandchildren, ...), parents first."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def _signal(pids, sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _freeze_descendants(pid: int) -> set[int]:
    """SIGSTOP every descendant of ``pid`` until a listing finds no new one (one forked
    while we looked); returns them all."""
    seen: set[int] = set()
    for _ in range(20):  # a fork bomb cannot keep this busy forever: each round stops more
        found = set(descendants(pid)) - seen
        if not found:
            break
        _signal(found, signal.SIGSTOP)
        seen |= found
    return seen


def kill_descendants(pid: int) -> None:
    """SIGKILL every descendant of ``pid`` (frozen first), not ``pid`` itself: what a
    guardian does for the worker it watches (danka/usercode/worker.py)."""
    _signal(_freeze_descendants(pid), signal.SIGKILL)


def kill_tree(pid: int, *, group: bool = True) -> None:
    """SIGKILL ``pid``, every descendant of it, and (``group``) its process group.

    The tree is frozen first: the root and every descendant found get SIGSTOP, the listing
    repeats until it finds no new process (one forked while we looked), then all get
    SIGKILL. A stopped root still adopts orphans (it stays their subreaper until it dies),
    so nothing escapes between the listing and the kill."""
    _signal([pid], signal.SIGSTOP)
    _signal(_freeze_descendants(pid), signal.SIGKILL)
    if group:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _signal([pid], signal.SIGKILL)


# ------------------------------------------------------------ the guardian of a worker
# A SIGKILLed trainer runs no clean-up, and a worker killed by the parent-death signal
# cannot either: what its user code started outlived both. So the process the trainer
# starts forks the worker and stays as its guardian, running no user code: the trainer's
# death reaches it as a signal it waits for, and it kills every descendant.

_GUARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)


def _exit_as(status: int) -> None:
    """End this process as the child whose wait ``status`` this is ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is not to end the process
    os._exit(os.WEXITSTATUS(status))


def _guard(parent_pid: int, worker: int) -> None:
    """The guardian's life: wait for the worker's end, the parent-death signal (SIGTERM)
    or a hang-up; reap adopted orphans; end every descendant before exiting. Never
    returns."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the pipes are the worker's: the guardian holds no end of them
    os.dup2(devnull, 1)
    os.closerange(3, 65536)
    while True:
        info = signal.sigtimedwait(_GUARDED, 1.0)
        while True:  # reap: the worker, and orphans of user code adopted as subreaper
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == worker:
                kill_descendants(os.getpid())  # what the worker left running
                _exit_as(status)
        if (info is not None and info.si_signo != signal.SIGCHLD) or os.getppid() != parent_pid:
            kill_descendants(os.getpid())  # the trainer is gone: the worker and all it started
            os._exit(1)


def fork_guarded(parent_pid: int) -> None:
    """Fork; this process becomes the guardian of the child (:func:`_guard`, never
    returns) and the child returns: the worker. The guardian gets SIGTERM when
    ``parent_pid`` (the trainer) dies and adopts orphans (a subreaper). Linux only;
    elsewhere there is no guardian (this process is the worker itself)."""
    if not sys.platform.startswith("linux"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, _GUARDED)  # pending until sigtimedwait
    set_parent_death_signal(signal.SIGTERM)
    become_subreaper()
    if os.getppid() != parent_pid:  # the trainer died before we asked
        os._exit(1)
    worker = os.fork()
    if worker != 0:
        _guard(parent_pid, worker)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _GUARDED)
