"""Calling reward functions safely: timeouts, crashes, None/NaN, and the on_error policy.

Design choice: user functions run in a separate **process**, one per function, which
loads the function itself from its file path. A call that exceeds ``timeout_s`` gets
the process SIGKILLed and a fresh one started for the remaining samples. Why a process
and not a thread pool with abandoned threads:

* a thread cannot be killed: an abandoned thread stuck in a busy loop keeps burning a
  CPU core for the rest of training, and a non-daemon thread blocks interpreter exit;
* a C extension that never releases the GIL would freeze the trainer thread too;
* SIGALRM timeouts only work in the main thread.

The process is a fresh interpreter (``subprocess`` + two OS pipes wrapped in
``multiprocessing.connection.Connection``) rather than multiprocessing's "spawn", which
re-imports the parent's ``__main__`` in the child (re-running a user script that lacks
an ``if __name__ == "__main__"`` guard), or "fork", which is unsafe in a process holding
CUDA contexts and threads. The worker imports only the standard library and danka's
torch-free reward modules, so it starts in a fraction of a second plus whatever the
user's file imports; arguments are plain dicts of strings. It exits by itself if the
trainer dies (pipe EOF, or a parent-watch thread while stuck in a call). POSIX only
(``pass_fds``).

Builtin rewards run in-process (they are ours and fast).

on_error (for exceptions, timeouts, bad return types, None, NaN and +-inf):
  "fail" (default): raise RewardFunctionError (a UserError) showing the sample, the
  function and the traceback; "zero": score 0.0; "skip_sample": score 0.0 and the
  sample is marked invalid (the trainer drops it from the update).
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
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from danka.errors import UserError
from danka.rewards.custom import (
    CustomReward,
    call_custom,
    load_function_from_file,
    problem_with,
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


def _watch_parent(parent_pid: int) -> None:
    # If the trainer dies while we are stuck in a user call, nobody reads the pipe: exit.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(1)


def _worker_entry() -> None:
    """Worker process, started as ``python -c _WORKER_CODE <read_fd> <write_fd> <path>
    <function> <kind> <parent_pid>``: load the function, then answer each ("run", calls,
    kwargs) message with one ("ok", value) or ("err", traceback) message per call."""
    read_fd, write_fd, path, function, kind, parent_pid = sys.argv[1:7]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    threading.Thread(target=_watch_parent, args=(int(parent_pid),), daemon=True).start()
    inbox = Connection(int(read_fd), writable=False)
    outbox = Connection(int(write_fd), readable=False)
    try:
        fn = load_function_from_file(Path(path), function)
    except BaseException as exc:  # noqa: BLE001
        outbox.send(("load_error", str(exc)))
        return
    outbox.send(("ready", None))
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
                outbox.send(("ok", call_custom(fn, kind, args, kwargs)))  # type: ignore[arg-type]
            except BaseException:  # noqa: BLE001 - report everything, keep serving
                outbox.send(("err", traceback.format_exc()))


_WORKER_CODE = "from danka.rewards.guard import _worker_entry; _worker_entry()"
_LIVE_WORKERS: weakref.WeakSet[_Worker] = weakref.WeakSet()


@atexit.register
def _kill_live_workers() -> None:
    # A worker stuck in user code would otherwise outlive the trainer by up to 1 s.
    for worker in list(_LIVE_WORKERS):
        worker.close()


class _Worker:
    """One worker process serving one user function; restarted after a timeout."""

    def __init__(self, custom: CustomReward, timeout_s: float):
        self.custom, self.timeout_s = custom, float(timeout_s)
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None  # to the worker
        self._conn: Connection | None = None  # from the worker

    def _start(self) -> None:
        c = self.custom
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        env = dict(os.environ)
        # the child must import this very danka, wherever the parent found it
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        argv = [sys.executable, "-c", _WORKER_CODE, str(to_child_r), str(to_parent_w)]
        argv += [str(c.path), c.function, c.kind, str(os.getpid())]
        try:
            self._proc = subprocess.Popen(argv, env=env, pass_fds=(to_child_r, to_parent_w))
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
                f"loading the reward file took over {_LOAD_TIMEOUT_S:.0f} s in the worker",
                where=c.spec,
                fix="make the file's import-time code fast (no downloads or long setup)",
            )
        try:
            status, detail = self._conn.recv()
        except (EOFError, OSError):
            status, detail = "load_error", f"worker exited with code {self._proc.wait()}"
        if status != "ready":
            self.close()
            raise UserError(
                f"the reward worker could not load the function: {detail}", where=c.spec
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
                    error = f"timed out after {self.timeout_s:g} s (the worker was killed and restarted)"
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
        """Stop the worker (SIGKILL: it may be stuck in user code)."""
        if self._proc is not None:
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

    values: list[float]  # finite scores; 0.0 where an error was replaced
    valid: list[bool]  # False where on_error == "skip_sample" dropped the sample
    num_errors: int  # samples with an exception, timeout, bad type, None or NaN


def _clip(text: Any, n: int) -> str:
    text = str(text)
    return repr(text if len(text) <= n else text[:n] + f"... [{len(text) - n} more chars]")


class GuardedReward:
    """One reward function (a builtin ``fn(completion, row, **kw)`` run in-process, or a
    :class:`CustomReward` run in its worker process) plus its kwargs and error policy.

    ``timeout_s`` bounds ONE call: one sample for verl-style functions, the whole batch
    for TRL-style (batched) ones, whose failure then counts for every sample."""

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
        self.where = fn.spec if isinstance(fn, CustomReward) else f"builtin reward {name!r}"
        self._worker = _Worker(fn, timeout_s) if isinstance(fn, CustomReward) else None

    def outcomes(
        self,
        rows: Sequence[PromptRow],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Outcome]:
        """(value, error) per sample, before the on_error policy."""
        if self._worker is None:
            return [self._call_builtin(c, r) for c, r in zip(completions, rows)]
        if self.fn.kind == "verl":  # type: ignore[union-attr]
            calls = [verl_call_args(r, c) for r, c in zip(rows, completions)]
            return self._worker.run(calls, self.kwargs)
        args = trl_call_args(rows, completions, completion_ids)
        [(values, error)] = self._worker.run([args], self.kwargs)
        if error is not None:  # one batched call failed: every sample shares the error
            return [(None, error)] * len(completions)
        return [(v, None) for v in values]

    def _call_builtin(self, completion: str, row: PromptRow) -> Outcome:
        from danka.rewards.custom import to_score

        try:
            return to_score(self.fn(completion, row, **self.kwargs)), None  # type: ignore[operator]
        except Exception:  # noqa: BLE001
            return None, traceback.format_exc()

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
        errors = 0
        for i, (value, error) in enumerate(self.outcomes(rows, completions, completion_ids)):
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
        return GuardedScores(values=values, valid=valid, num_errors=errors)

    def error(
        self, i: int, row: PromptRow, prompt: str, completion: str, reason: str
    ) -> RewardFunctionError:
        """The error shown when this function fails on sample ``i``."""
        lines = reason.strip().splitlines()
        shown = "\n    ".join(lines[-12:])
        hint = ""
        if (
            reason == "returned None"
            and isinstance(self.fn, CustomReward)
            and self.fn.kind == "trl"
        ):
            hint = " (TRL reads None as 'not applicable' and sums the others: on_error: zero does the same)"
        return RewardFunctionError(
            f"reward function {self.name!r} failed on completion {i} (data row {row.index}):\n"
            f"    {shown}\n"
            f"  prompt:     {_clip(prompt, 200)}\n"
            f"  completion: {_clip(completion, 300)}",
            where=self.where,
            fix="make the function return a finite number for every completion, or set the "
            "rewards on_error option to zero (score 0) or skip_sample (drop the sample)" + hint,
        )

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
