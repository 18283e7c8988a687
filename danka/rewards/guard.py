"""Calling reward functions safely: timeouts, crashes, NaN, None, and the on_error policy.

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

Limits: processes started by user code survive a SIGKILLed trainer when the worker died
by the parent-death signal while they ran (the kernel signals the worker, not its
group). The parent-death signal fires when the THREAD that started the worker exits; a
worker found dead is restarted before the next batch, so calling from short-lived threads
costs restarts, not scores.

on_error applies to exceptions, timeouts, bad return types, NaN and +-inf; and to None
from a per-sample (verl-style) function or a builtin, which must return a number:
  "fail" (default): raise RewardFunctionError (a UserError) showing the sample, the
  function and the traceback; "zero": score 0.0; "skip_sample": score 0.0 and the
  sample is marked invalid (the trainer drops it from the update).

None from a TRL-style (batched) function is NOT an error: as in TRL's GRPOTrainer it
means "this function does not apply to this sample". The sample's entry is marked not
applicable (``GuardedScores.applies``) and the function adds nothing to that sample's
weighted sum (TRL: NaN, then ``nansum``); see combine.py for a sample no function
applies to.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from danka.errors import UserError
from danka.rewards.custom import (
    CustomReward,
    call_custom,
    load_function_from_file,
    problem_with,
    to_score,
    trl_call_args,
    verl_call_args,
)

if TYPE_CHECKING:
    from danka.types import PromptRow

ON_ERROR = ("fail", "zero", "skip_sample")
_LOAD_TIMEOUT_S = 120.0  # importing the user's file (it may import torch, sympy, ...)

# An outcome per sample: (value, error). error is None when the call itself succeeded
# (value may still be None/NaN, which the policy judges), else the reason it failed.
Outcome = tuple["float | None", "str | None"]


class RewardFunctionError(UserError):
    """A reward function failed on a sample and on_error is "fail"."""


# ---- the worker process ----------------------------------------------------------------

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux); then make sure the parent did
    not die before we asked (the signal would never come)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog thread still covers it
    if os.getppid() != parent_pid:
        _kill_own_group()


def _kill_own_group() -> None:
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)  # this worker and what user code started
    finally:
        os._exit(1)


def _watch_parent(parent_pid: int) -> None:
    # If the trainer dies while we are stuck in a user call, nobody reads the pipe: exit.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            _kill_own_group()


def _send(outbox: Connection, message: tuple[str, Any]) -> None:
    try:
        outbox.send(message)
    except OSError:  # BrokenPipeError included: the trainer is gone, leave quietly
        os._exit(0)


def _load(path: str, function: str, kind: str) -> Callable[..., Any]:
    if kind == "builtin":
        from danka.rewards.builtin import load_builtin

        return load_builtin(function)
    return load_function_from_file(Path(path), function)


def _call(fn: Callable[..., Any], kind: str, args: dict[str, Any], kw: dict[str, Any]) -> Any:
    if kind == "builtin":
        return to_score(fn(args["completion"], SimpleNamespace(**args["row"]), **kw))
    return call_custom(fn, kind, args, kw)  # type: ignore[arg-type]


def _worker_entry() -> None:
    """Worker process, started as ``python -c _WORKER_CODE <read_fd> <write_fd> <path>
    <function> <kind> <parent_pid>``: load the function, then answer each ("run", calls,
    kwargs) message with one ("ok", value) or ("err", traceback) message per call."""
    read_fd, write_fd, path, function, kind, parent_pid = sys.argv[1:7]
    _die_with_parent(int(parent_pid))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    threading.Thread(target=_watch_parent, args=(int(parent_pid),), daemon=True).start()
    inbox = Connection(int(read_fd), writable=False)
    outbox = Connection(int(write_fd), readable=False)
    try:
        fn = _load(path, function, kind)
    except BaseException as exc:  # noqa: BLE001
        _send(outbox, ("load_error", str(exc)))
        return
    _send(outbox, ("ready", None))
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


_WORKER_CODE = "from danka.rewards.guard import _worker_entry; _worker_entry()"
_LIVE_WORKERS: weakref.WeakSet[_Worker] = weakref.WeakSet()


@atexit.register
def _kill_live_workers() -> None:
    # A worker stuck in user code would otherwise outlive the trainer by up to 1 s.
    for worker in list(_LIVE_WORKERS):
        worker.close()


@dataclass(frozen=True)
class _Target:
    """What a worker loads: a builtin by name, or ``function`` from the file ``path``."""

    path: str  # "" for a builtin
    function: str
    kind: str  # "builtin", "verl" or "trl"
    where: str  # for error messages


class _Worker:
    """One worker process serving one reward function; restarted after a timeout."""

    def __init__(self, target: _Target, timeout_s: float):
        self.target, self.timeout_s = target, float(timeout_s)
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None  # to the worker
        self._conn: Connection | None = None  # from the worker

    @property
    def pid(self) -> int | None:
        """The worker's pid (= its process group id), None when not running."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        t = self.target
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        env = dict(os.environ)
        # the child must import this very danka, wherever the parent found it
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        argv = [sys.executable, "-c", _WORKER_CODE, str(to_child_r), str(to_parent_w)]
        argv += [t.path, t.function, t.kind, str(os.getpid())]
        try:
            self._proc = subprocess.Popen(
                argv, env=env, pass_fds=(to_child_r, to_parent_w), start_new_session=True
            )
        except BaseException:
            os.close(to_child_w)
            os.close(to_parent_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(to_parent_w)
        self._send = Connection(to_child_w, readable=False)
        self._conn = Connection(to_parent_r, writable=False)
        _LIVE_WORKERS.add(self)
        if not self._conn.poll(_LOAD_TIMEOUT_S):
            self.close()
            raise UserError(
                f"loading the reward function took over {_LOAD_TIMEOUT_S:.0f} s in the worker",
                where=t.where,
                fix="make the file's import-time code fast (no downloads or long setup)",
            )
        try:
            status, detail = self._conn.recv()
        except (EOFError, OSError):
            status, detail = "load_error", f"worker exited with code {self._proc.wait()}"
        if status != "ready":
            self.close()
            raise UserError(
                f"the reward worker could not load the function: {detail}", where=t.where
            )

    def run(
        self, calls: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> list[tuple[Any, str | None]]:
        """One (result, error) per call, in order. A call over the timeout, or a worker
        death, yields an error for that call; a new worker serves the rest."""
        out: list[tuple[Any, str | None]] = []
        while len(out) < len(calls):
            if self._proc is None or self._proc.poll() is not None:
                self.close()
                self._start()
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
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # the group id is the worker's pid
            except (ProcessLookupError, PermissionError):
                pass  # group already gone
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None
        for conn in (self._send, self._conn):
            if conn is not None:
                conn.close()
        self._send = self._conn = None
        _LIVE_WORKERS.discard(self)


# ---- the guarded function ----------------------------------------------------------------


@dataclass
class GuardedScores:
    """What one reward function gave a batch after the on_error policy. Shapes: B."""

    values: list[float]  # finite scores; 0.0 where an error was replaced or not applicable
    valid: list[bool]  # False where on_error == "skip_sample" dropped the sample
    num_errors: int  # samples with an exception, timeout, bad type or NaN (or verl None)
    # False where a TRL-style function returned None ("does not apply to this sample")
    applies: list[bool] = field(default_factory=list)


def _clip(text: Any, n: int) -> str:
    text = str(text)
    return repr(text if len(text) <= n else text[:n] + f"... [{len(text) - n} more chars]")


def _builtin_name(fn: Callable[..., Any]) -> str:
    from danka.rewards.builtin import REWARDS

    for name, registered in REWARDS.items():
        if registered is fn:
            return name
    raise ValueError(
        f"{getattr(fn, '__qualname__', fn)!r} is not a registered builtin reward: register it "
        "with @register_reward(name) in danka/rewards/builtin.py, or load a user function "
        "with load_reward_function (the worker process must be able to find it)"
    )


def _row_fields(row: PromptRow) -> dict[str, Any]:
    # What a builtin may read from its row, as plain data (PromptRow imports torch).
    return {"ground_truth": row.ground_truth, "data_source": row.data_source, "index": row.index}


class GuardedReward:
    """One reward function (a registered builtin ``fn(completion, row, **kw)``, or a
    :class:`CustomReward`) run in its worker process, plus its kwargs and error policy.

    ``timeout_s`` bounds ONE call: one sample for builtins and verl-style functions, the
    whole batch for TRL-style (batched) ones, whose failure then counts for every sample."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., float] | CustomReward,
        kwargs: dict[str, Any] | None = None,
        *,
        timeout_s: float = 30.0,
        on_error: str = "fail",
    ):
        if on_error not in ON_ERROR:
            raise UserError(
                f"unknown on_error {on_error!r}", fix=f"use one of: {', '.join(ON_ERROR)}"
            )
        if timeout_s <= 0:
            raise UserError(f"reward timeout must be > 0 s, got {timeout_s}")
        self.name, self.fn, self.kwargs = name, fn, dict(kwargs or {})
        self.on_error = on_error
        if isinstance(fn, CustomReward):
            self.kind: str = fn.kind
            self.where = fn.spec
            target = _Target(str(fn.path), fn.function, fn.kind, fn.spec)
        else:
            builtin = _builtin_name(fn)
            self.kind, self.where = "builtin", f"builtin reward {builtin!r}"
            target = _Target("", builtin, "builtin", self.where)
        self._worker = _Worker(target, timeout_s)

    @property
    def worker_pid(self) -> int | None:
        """The worker process's pid (its process group id), None before the first call."""
        return self._worker.pid

    def outcomes(
        self,
        rows: Sequence[PromptRow],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Outcome]:
        """(value, error) per sample, before the on_error policy."""
        if self.kind == "builtin":
            calls = [{"completion": c, "row": _row_fields(r)} for c, r in zip(completions, rows)]
            return self._worker.run(calls, self.kwargs)
        if self.kind == "verl":
            calls = [verl_call_args(r, c) for r, c in zip(rows, completions)]
            return self._worker.run(calls, self.kwargs)
        args = trl_call_args(rows, completions, completion_ids)
        [(values, error)] = self._worker.run([args], self.kwargs)
        if error is not None:  # one batched call failed: every sample shares the error
            return [(None, error)] * len(completions)
        return [(v, None) for v in values]

    def __call__(
        self,
        rows: Sequence[PromptRow],
        prompts: Sequence[str],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> GuardedScores:
        """Scores of one batch under the on_error policy (see the module docstring)."""
        values: list[float] = []
        valid: list[bool] = []
        applies: list[bool] = []
        errors = 0
        for i, (value, error) in enumerate(self.outcomes(rows, completions, completion_ids)):
            if error is None and value is None and self.kind == "trl":
                values.append(0.0)  # TRL: None = not applicable, left out of the sum
                valid.append(True)
                applies.append(False)
                continue
            applies.append(True)
            reason = error or problem_with(value)
            if reason is None:
                values.append(float(value))  # type: ignore[arg-type]
                valid.append(True)
                continue
            errors += 1
            if self.on_error == "fail":
                raise self.error(i, rows[i], prompts[i], completions[i], reason)
            values.append(0.0)
            valid.append(self.on_error != "skip_sample")
        return GuardedScores(values=values, valid=valid, num_errors=errors, applies=applies)

    def error(
        self, i: int, row: PromptRow, prompt: str, completion: str, reason: str
    ) -> RewardFunctionError:
        """The error shown when this function fails on sample ``i``."""
        lines = reason.strip().splitlines()
        shown = "\n    ".join(lines[-12:])
        hint = ""
        if reason == "returned None" and self.kind == "verl":
            hint = (
                " (None means 'not applicable' only for batched TRL-style functions; a verl "
                "compute_score must return a number)"
            )
        return RewardFunctionError(
            f"reward function {self.name!r} failed on completion {i} (data row {row.index}):\n"
            f"    {shown}\n"
            f"  prompt:     {_clip(prompt, 200)}\n"
            f"  completion: {_clip(completion, 300)}",
            where=self.where,
            fix="make the function return a finite number for every completion, or set "
            "reward.on_error to zero (score 0) or skip_sample (drop the sample)" + hint,
        )

    def close(self) -> None:
        self._worker.close()
