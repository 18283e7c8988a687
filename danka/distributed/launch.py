"""``python -m danka.distributed.launch TORCHRUN_ARGS``: torchrun, with the failing rank's
exit code and message, whatever the order in which the ranks exit.

``torchrun`` (``torch.distributed.run``) turns any worker failure into its own
``ChildFailedError`` traceback and exit code 1, so a bad config found after the process
group is up (exit 2 in one process) reads as a crash. Its record of who failed first is not
enough either: when rank 1 fails, it aborts its communicators and rank 0, blocked in a
collective, fails in turn ("connection closed by peer", exit 1); under CPU load rank 0 may
EXIT first, and the agent then SIGTERMs rank 1 (perhaps before it printed its message).

So the failing rank writes its report BEFORE it aborts anything (:func:`record_failure`,
called by ``danka.distributed.destroy``): ``failure.ATTEMPT.json`` in a folder this
launcher makes and names in ``DANKA_FAILURE_DIR``, the first writer wins. Whatever fails
after the abort finds the report there and is a consequence: it exits quietly (no "closed
by peer" traceback). When the agent reports failed workers, the launcher prints the report (the
``danka: error: ...`` line, or a real bug's traceback) once, last, and exits with its code
(2 bad input, 3 training fault, 1 a crash). Without a report (a worker killed by a signal,
a failure outside ``destroy``) it falls back to :func:`exit_code` over the agent's failures.
The agent's log lines are kept below CRITICAL so no launcher traceback or summary follows.
Under plain ``torchrun`` (no ``DANKA_FAILURE_DIR``) workers report as before, themselves.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

FAILURE_DIR_ENV = "DANKA_FAILURE_DIR"


def _report_name(attempt: int) -> str:
    """One report per attempt of the worker group (torchrun ``--max-restarts`` restarts it:
    a failure of the new group must not read as a consequence of the old group's)."""
    return f"failure.{attempt}.json"


def launcher_argv(torchrun_args: list[str]) -> list[str]:
    """The command line that runs ``torchrun TORCHRUN_ARGS`` through this launcher."""
    return [sys.executable, "-m", "danka.distributed.launch", *torchrun_args]


def failure_report(exc: BaseException) -> tuple[int, str]:
    """(exit code, text) as ``danka``'s CLI reports ``exc``: a UserError (TrainingFault...),
    or a library error that :func:`danka.errors.as_user_error` recognises as the user's,
    is one line ``danka: error: ...`` and its ``exit_code``; anything else is a bug: its
    traceback and 1."""
    from danka.errors import as_user_error

    user = as_user_error(exc)  # a library error caused by a user file counts too
    if user is not None:
        return user.exit_code, f"danka: error: {user}"
    return 1, "".join(traceback.format_exception(exc)).rstrip()


def record_failure(exc: BaseException, rank: int) -> bool | None:
    """Report this rank's failure for the launcher, before the communicators are aborted.

    True: this rank is the first to fail, its report is written. False: another rank's
    report is already there, so this failure is a consequence of that one (its abort).
    None: not under this launcher (no ``DANKA_FAILURE_DIR``), nothing written.
    The report appears atomically (written aside, then hard-linked: the link fails if a
    report exists), so of two ranks failing at once exactly one is the cause."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder or not Path(folder).is_dir():
        return None
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    final = Path(folder) / _report_name(attempt)
    if final.exists():
        return False
    code, text = failure_report(exc)
    report = {"rank": rank, "exit_code": code, "text": text, "time": time.time()}
    aside = Path(folder) / f".rank{rank}.{os.getpid()}.json"
    try:
        aside.write_text(json.dumps(report))
        os.link(aside, final)
    except FileExistsError:
        return False
    except OSError:  # the folder went away: report as under plain torchrun
        return None
    finally:
        aside.unlink(missing_ok=True)
    return True


def read_failure(folder: str | Path) -> dict | None:
    """The report a worker of the LAST attempt left in ``folder`` (rank, exit_code, text,
    time), or None."""
    reports = sorted(Path(folder).glob("failure.*.json"), key=lambda p: int(p.name.split(".")[1]))
    try:
        return json.loads(reports[-1].read_text()) if reports else None
    except (OSError, ValueError):
        return None


def exit_code(failures: dict) -> int:
    """The launcher's exit code for torchrun's ``{rank: ProcessFailure}`` when no worker left
    a report: codes > 1 first, then 1, then signals (as 128 + the signal number, shell
    convention); within a class the earliest failure, then the lowest rank."""
    if not failures:
        return 0

    def cause(kv) -> tuple:
        code = kv[1].exitcode
        return (0 if code > 1 else 1 if code == 1 else 2, kv[1].timestamp, kv[0])

    ranked = sorted(failures.items(), key=cause)
    code = ranked[0][1].exitcode
    return code if code > 0 else 128 + (-code or 1)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    for name in ("torch.distributed.elastic", "torch.distributed.run"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    folder = tempfile.mkdtemp(prefix="danka-failure-")
    os.environ[FAILURE_DIR_ENV] = folder  # the workers inherit the agent's environment
    try:
        run(args)
    except ChildFailedError as err:
        report = read_failure(folder)
        if report is None:
            return exit_code(err.failures)
        print(report["text"], file=sys.stderr, flush=True)
        return int(report["exit_code"])
    except SignalException as err:  # SIGTERM/SIGINT to the launcher: workers were stopped
        return 128 + int(err.sigval)
    except KeyboardInterrupt:
        return 130
    finally:
        os.environ.pop(FAILURE_DIR_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
