"""One signal policy for every command: SIGTERM unwinds the stack instead of killing it.

Python's default for SIGTERM (and SIGHUP) ends the process at once: no ``finally`` block,
no context manager, no ``atexit`` runs. A ``danka generate`` converting a GGUF left its
temporary folder (up to ~540 MB, forever), a ``danka eval`` stopped by ``timeout`` lost
every answer it had. So the CLI runs every command inside :func:`exit_on_terminate`: the
signal raises :class:`Terminated` (a ``SystemExit`` with code 128 + signal, 143 for
SIGTERM) in the main thread, the command's clean-up runs as for any error (temporary
folders removed, partial results written), and ``danka`` exits with that code. SIGINT
stays Python's ``KeyboardInterrupt`` (exit 130). ``danka train`` installs its own handlers
inside (danka.lifecycle.StopRequest: it saves a checkpoint after the step).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived; ``code`` is 128 + the signal (143 for SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum: int, frame) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def exit_on_terminate() -> Iterator[None]:
    """SIGTERM/SIGHUP raise :class:`Terminated` while inside (main thread only; elsewhere
    nothing changes). The old handlers come back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, _raise) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def stop_code(err: BaseException) -> int | None:
    """The exit code of a stop by signal (Terminated: 128 + signal, KeyboardInterrupt:
    130), None for anything else."""
    if isinstance(err, Terminated):
        return int(err.code)
    if isinstance(err, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return None
