"""The reward worker process: one per reward function, with timeouts that kill its group.

Design choice: every reward function, builtin or user, runs in a separate **process**
(one per function, started on first use and kept for the run), which loads the function
itself (a builtin by name, a user function from its file path). A call that exceeds
``timeout_s`` gets the worker's whole process group SIGKILLed (so a ``sleep 300`` the
user's code started dies with it) and a fresh worker serves the remaining samples. Why a
process and not a thread pool with abandoned threads:

* a thread cannot be killed: an abandoned thread stuck in a busy loop (or in a regex
  backtracking inside ``re``, which holds the GIL) keeps burning a CPU core for the rest
  of training, and a non-daemon thread blocks interpreter exit;
* a C extension that never releases the GIL would freeze the trainer thread too;
* SIGALRM timeouts only work in the main thread.

The process is a fresh interpreter (``subprocess`` + two OS pipes wrapped in
``multiprocessing.connection.Connection``) rather than multiprocessing's "spawn", which
re-imports the parent's ``__main__`` in the child (re-running a user script that lacks
an ``if __name__ == "__main__"`` guard), or "fork", which is unsafe in a process holding
CUDA contexts and threads. The worker imports only the standard library and danka's
torch-free reward modules; arguments are plain dicts of strings. Builtins pay one pipe
round trip per batch, not a process per call. POSIX only (``pass_fds``).

The worker never outlives the trainer:

* it runs in its own session and process group (``start_new_session``), so a terminal's
  Ctrl-C or a scheduler's SIGTERM to the trainer's group does not reach it, and a
  timeout kills the group (the worker and everything it started);
* on Linux it asks the kernel for SIGKILL when its parent dies (``prctl
  PR_SET_PDEATHSIG``): a SIGKILLed trainer cannot leave a worker spinning at 100% CPU,
  even one stuck in C code holding the GIL. Elsewhere, and as a fallback, a watchdog
  thread polls ``os.getppid()`` and kills the worker's group when the parent is gone;
* a worker whose pipe to the trainer is closed exits quietly (no BrokenPipe traceback).

Processes the user's code starts are ended with the worker, detached ones too: the
worker is a child subreaper (Linux), so a ``setsid`` daemon or a double-forked child stays
in its process tree, and :func:`kill_group` freezes and kills that whole tree
(danka/subprocs.py). The file itself is imported here, never in the trainer: a file that
exits, crashes or hangs at import ends or blocks its worker, and loading reports it
(within :func:`load_timeout`).

A SIGKILLed trainer runs no clean-up, and a worker killed by the kernel's parent-death
signal cannot run any either: what the user's code started (a ``subprocess.run`` in
progress, a detached daemon) outlived both. So the process the trainer starts is a
GUARDIAN that runs no user code: it forks the worker and waits. The trainer's death
reaches the guardian as a signal it waits for (``sigtimedwait``, never blocked by user
code), and it SIGKILLs every descendant (frozen first; the worker, what it started,
orphans it adopted) before it exits. When the worker ends on its own the guardian ends
its leftovers too and exits as the worker did (its exit code or signal). The trainer's
view is unchanged: one process (the guardian, whose pid is the group id) with the
worker's pipes.

Limits: the parent-death signal fires when the THREAD that started the worker exits; a
worker found dead is restarted before the next batch, so calling from short-lived
threads costs restarts, not scores.
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from danka.errors import UserError
from danka.usercode.contract import call_custom, contract_of, load_function_from_file, to_score
from danka.usercode.subprocs import (
    become_subreaper,
    descendants,
    fork_guarded,
    kill_tree,
    set_parent_death_signal,
)

LOAD_FLOOR_S = 10.0  # the least time a worker gets to start and import the file


def load_timeout(timeout_s: float) -> float:
    """How long a worker may take to start and import its file: the call timeout
    (``reward.timeout_s``), but never under :data:`LOAD_FLOOR_S` (a fresh interpreter
    on a busy machine, and a file that imports torch, need a few seconds)."""
    return max(float(timeout_s), LOAD_FLOOR_S)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux); then make sure the parent did
    not die before we asked (the signal would never come)."""
    set_parent_death_signal(signal.SIGKILL)  # where it fails, the watchdog thread covers it
    if os.getppid() != parent_pid:
        _kill_own_group()


def _kill_own_group() -> None:
    try:  # what user code started, detached (setsid) ones too: they are our descendants
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.killpg(os.getpgid(0), signal.SIGKILL)  # this worker and its process group
    finally:
        os._exit(1)


def _watch_parent(parent_pid: int) -> None:
    # If the trainer dies while we are stuck in a user call, nobody reads the pipe: exit.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            _kill_own_group()


def guard_child(parent_pid: int) -> None:
    """Call first thing in a worker process started with ``start_new_session=True``. This
    process becomes the guardian (``subprocs.fork_guarded``) and a forked child the
    worker, which returns from here: it dies with the guardian, adopts orphaned
    descendants (a ``setsid`` child of user code stays in reach of :func:`kill_group`),
    leaves Ctrl-C to the trainer and watches for the guardian's death (the tool worker,
    danka/agent/worker.py, uses this too)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    fork_guarded(parent_pid)  # returns in the forked worker only
    guardian = os.getppid()
    _die_with_parent(guardian)
    become_subreaper()
    threading.Thread(target=_watch_parent, args=(guardian,), daemon=True).start()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker started with ``start_new_session=True``, its process group and
    every descendant (detached ones included: the worker is their subreaper), then reap
    it."""
    if proc.poll() is None:
        kill_tree(proc.pid)
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group id is the worker's pid
        except (ProcessLookupError, PermissionError):
            pass  # group already gone
    proc.wait()


def _send(outbox: Connection, message: tuple[str, Any]) -> None:
    try:
        outbox.send(message)
    except OSError:  # BrokenPipeError included: the trainer is gone, leave quietly
        os._exit(0)


def _load(path: str, function: str, kind: str) -> tuple[Callable[..., Any], str]:
    """The function and its contract; ``kind`` "auto" detects verl or TRL (UserError for
    neither, with both signatures)."""
    if kind == "builtin":  # by name, through the registry module that owns the builtins
        module, _, attr = BUILTIN_LOADER.partition(":")
        return getattr(importlib.import_module(module), attr)(function), kind
    fn = load_function_from_file(Path(path), function)
    return fn, (contract_of(fn, Path(path), function) if kind == "auto" else kind)


def _call(fn: Callable[..., Any], kind: str, args: dict[str, Any], kw: dict[str, Any]) -> Any:
    if kind == "builtin":
        return to_score(fn(args["completion"], SimpleNamespace(**args["row"]), **kw))
    return call_custom(fn, kind, args, kw)  # type: ignore[arg-type]


def _worker_entry() -> None:
    """Worker process, started as ``python -c _WORKER_CODE <read_fd> <write_fd> <path>
    <function> <kind> <parent_pid>``: load the function, say ("ready", kind) or
    ("load_error", (what, where, fix)), then answer each ("run", calls, kwargs) message
    with one ("ok", value) or ("err", traceback) message per call."""
    read_fd, write_fd, path, function, kind, parent_pid = sys.argv[1:7]
    guard_child(int(parent_pid))
    inbox = Connection(int(read_fd), writable=False)
    outbox = Connection(int(write_fd), readable=False)
    try:
        fn, kind = _load(path, function, kind)
    except UserError as exc:
        _send(outbox, ("load_error", (exc.what, exc.where, exc.fix)))
        return
    except BaseException as exc:  # noqa: BLE001
        _send(outbox, ("load_error", (str(exc), None, None)))
        return
    _send(outbox, ("ready", kind))
    while True:
        try:
            msg = inbox.recv()
        except (EOFError, OSError):
            return  # the trainer closed the pipe or died
        if msg[0] == "stop":
            return
        _, calls, kwargs = msg
        for args in calls:
            try:
                result = ("ok", _call(fn, kind, args, kwargs))
            except BaseException:  # noqa: BLE001 - report everything, keep serving
                result = ("err", traceback.format_exc())
            _send(outbox, result)


_WORKER_CODE = "from danka.usercode.worker import _worker_entry; _worker_entry()"
# owners (reward Worker, agent ToolRunner) of running worker processes: closed at exit
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _close_live_workers() -> None:
    # A worker stuck in user code would otherwise outlive the trainer by up to 1 s.
    for owner in list(_LIVE):
        owner.close()


def spawn_worker(owner: Any, code: str, args: list[str], **popen_kw: Any) -> subprocess.Popen:
    """``python -c code *args`` in its own session (see the module docstring), importing
    this very danka; ``owner.close()`` runs at interpreter exit until :func:`forget_worker`
    (the tool worker, danka/agent/worker.py, uses this too)."""
    env = dict(os.environ)
    # the child must import this very danka, wherever the parent found it
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, start_new_session=True, **popen_kw
    )
    _LIVE.add(owner)
    return proc


def forget_worker(owner: Any) -> None:
    """``owner`` closed its worker: no need to close it at exit."""
    _LIVE.discard(owner)


# where builtins are looked up (imported in the worker only, by name: the rewards package
# sits above this one and registers the builtins there)
BUILTIN_LOADER = "danka.rewards.builtin:load_builtin"


@dataclass(frozen=True)
class Target:
    """What a worker loads: a builtin by name, or ``function`` from the file ``path``."""

    path: str  # "" for a builtin
    function: str
    kind: str  # "builtin", "verl", "trl", or "auto" (the worker detects verl or TRL)
    where: str  # for error messages


class Worker:
    """One worker process serving one reward function; restarted after a timeout."""

    def __init__(self, target: Target, timeout_s: float):
        self.target, self.timeout_s = target, float(timeout_s)
        self.kind = target.kind  # "auto" until the first start says which contract
        self.adopted = False  # a GuardedReward took this worker over (guard._adopt)
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None  # to the worker
        self._conn: Connection | None = None  # from the worker

    @property
    def pid(self) -> int | None:
        """The worker's pid (= its process group id), None when not running."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> str:
        """Start the worker (if it is not running) and return the function's contract:
        "builtin", "verl" or "trl". UserError if the file cannot be loaded."""
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        return self.kind

    def _start(self) -> None:
        t = self.target
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        args = [str(to_child_r), str(to_parent_w), t.path, t.function, self.kind, str(os.getpid())]
        try:
            self._proc = spawn_worker(self, _WORKER_CODE, args, pass_fds=(to_child_r, to_parent_w))
        except BaseException:
            os.close(to_child_w)
            os.close(to_parent_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(to_parent_w)
        self._send = Connection(to_child_w, readable=False)
        self._conn = Connection(to_parent_r, writable=False)
        self.kind = self._ready(load_timeout(self.timeout_s))

    def _ready(self, limit: float) -> str:
        """Wait for the worker's ("ready", kind); UserError (the worker is killed, with
        everything it started) when loading fails, exits or takes over ``limit`` s."""
        t = self.target
        assert self._conn is not None and self._proc is not None
        fix = "make the file's import-time code fast (no downloads or long setup), or raise reward.timeout_s"
        if not self._conn.poll(limit):
            self.close()
            raise UserError(
                f"importing the reward file took over {limit:g} s (the limit is reward.timeout_s, "
                f"at least {LOAD_FLOOR_S:g} s); the worker and every process it started were "
                "stopped",
                where=t.where,
                fix=fix,
            )
        try:
            status, detail = self._conn.recv()
        except (EOFError, OSError):
            code = self._proc.wait()
            self.close()
            raise UserError(
                f"the reward file ended its worker process while being imported (exit code "
                f"{code}): nothing was scored",
                where=t.where,
                fix="remove the sys.exit()/os._exit()/exit() (or the crash) from the file's "
                f"top-level code; run `python {t.path}` to see what it does",
            ) from None
        if status != "ready":
            self.close()
            what, where, fix = detail
            raise UserError(what, where=where or t.where, fix=fix)
        return str(detail)

    def run(
        self, calls: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> list[tuple[Any, str | None]]:
        """One (result, error) per call, in order. A call over the timeout, or a worker
        death, yields an error for that call; a new worker serves the rest."""
        out: list[tuple[Any, str | None]] = []
        while len(out) < len(calls):
            self.start()
            assert self._send is not None and self._conn is not None and self._proc is not None
            pending = calls[len(out) :]
            self._send.send(("run", pending, kwargs))
            for _ in pending:
                error = None
                if not self._conn.poll(self.timeout_s):
                    error = (
                        f"timed out after {self.timeout_s:g} s "
                        "(the worker and its child processes were killed; a new one continues)"
                    )
                else:
                    try:
                        status, payload = self._conn.recv()
                    except (EOFError, OSError):
                        error = f"the reward worker process died (exit code {self._proc.wait()})"
                if error is not None:
                    self.close()
                    out.append((None, error))
                    break
                out.append((payload, None) if status == "ok" else (None, payload))
        return out

    def close(self) -> None:
        """Stop the worker and every process in its group (SIGKILL: it may be stuck in
        user code)."""
        if self._proc is not None:
            kill_group(self._proc)
            self._proc = None
        for conn in (self._send, self._conn):
            if conn is not None:
                conn.close()
        self._send = self._conn = None
        forget_worker(self)
