"""``python -m danka.distributed.launch TORCHRUN_ARGS``: torchrun, with the workers' exit code.

``torchrun`` (``torch.distributed.run``) turns any worker failure into its own
``ChildFailedError`` traceback and exit code 1, so a bad config found after the process
group is up (exit 2 in one process) reads as a crash. This launcher runs the same agent
(same arguments, same rendezvous) and, when a worker fails, exits with the code of the
worker that CAUSED it. The others fail as a consequence: stopped by the agent (a signal),
or, on gloo, a collective that raises "connection closed by peer" (exit 1), often within
the same second as the cause. So a deliberate danka code (2 bad input, 3 training fault,
any code > 1) wins over a generic 1, which wins over a signal; ties go to the earliest,
then the lowest rank. The worker has printed its own message (``danka: error: ...``); the
agent's log lines are kept below CRITICAL so no launcher traceback or summary follows it.
"""

from __future__ import annotations

import logging
import sys


def launcher_argv(torchrun_args: list[str]) -> list[str]:
    """The command line that runs ``torchrun TORCHRUN_ARGS`` through this launcher."""
    return [sys.executable, "-m", "danka.distributed.launch", *torchrun_args]


def exit_code(failures: dict) -> int:
    """The launcher's exit code for torchrun's ``{rank: ProcessFailure}``: codes > 1 first,
    then 1, then signals (as 128 + the signal number, shell convention); within a class the
    earliest failure, then the lowest rank."""
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
    try:
        run(args)
    except ChildFailedError as err:
        return exit_code(err.failures)
    except SignalException as err:  # SIGTERM/SIGINT to the launcher: workers were stopped
        return 128 + int(err.sigval)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
