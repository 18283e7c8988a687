"""A run's life around the training loop: one run per output dir, stop on a signal, exit codes.

- :class:`RunLock` makes a run the only one writing into its output dir. The lock is an
  ``flock`` on ``OUTPUT/.danka.lock`` (the kernel drops it when the process dies, so a
  killed run never blocks the next one); the file holds the owner's pid and is removed
  when the run ends. A second live run
  gets a UserError (exit 2) naming that pid; a lock file left by a dead run is taken over
  with a warning. Deleting the output dir of a live run deletes its lock file too, so a
  new run there gets a fresh lock: :func:`check_run_lock` (before every checkpoint write)
  notices and stops the old run instead of letting two runs mix files in one folder.
- :class:`StopRequest` turns SIGTERM/SIGINT into a flag the loop polls at a safe point (after
  a step): it saves a checkpoint there and the CLI exits with :attr:`StopRequest.exit_code`
  (143 terminated, 130 interrupted). A second Ctrl-C (or SIGTERM) aborts at once.
- :func:`run_forwarding_signals` runs a child (torchrun for ``--nproc``) in its own process
  group and forwards SIGTERM/SIGINT to its ranks (each saves after its step, as one
  process does); the child gets SIGTERM if this process dies.
- :class:`RankLock`: each rank of a ``--nproc`` run holds a shared lock on
  ``OUTPUT/.danka.ranks.lock`` and ends itself within a second of its launcher's death, so
  a new run can never share the folder with orphaned ranks (RunLock refuses while any
  rank lives).
- :func:`note_failure`: a failed run's message goes to ``OUTPUT/logs/train.log`` too, and a
  run that stopped before its first step leaves no metrics, evaluation or completions.

Exit codes of ``danka`` (docs/troubleshooting.md): 0 done, 1 a bug (traceback), 2 bad
input, 3 training fault, 130 interrupted (SIGINT/Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from danka.errors import UserError
from danka.io import OPEN_MODE

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143

LOCK_NAME = ".danka.lock"
LOCK_HELD_ENV = "DANKA_RUN_LOCK_HELD"  # set for children of a launcher that holds the lock

log = logging.getLogger("danka.lifecycle")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"
    except OSError:
        return True  # no /proc here: the signal test is all there is


class RunLock:
    """``with RunLock(output_dir):`` -- exclusive use of ``output_dir`` by this process.

    Raises UserError (exit 2) if another live process holds it. Reentrant across a
    launcher and its children through ``DANKA_RUN_LOCK_HELD`` (see :meth:`held_by_parent`).
    """

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_NAME
        self._fd: int | None = None
        self.took_over: int | None = None  # pid of a dead run whose lock file was left

    @staticmethod
    def held_by_parent() -> bool:
        """True in a process started by a launcher that holds the lock (torchrun ranks)."""
        return bool(os.environ.get(LOCK_HELD_ENV))

    def _read_pid(self) -> int | None:
        try:
            text = self.path.read_text(encoding="utf-8").split()
            return int(text[0]) if text else None
        except (OSError, ValueError):
            return None

    def acquire(self) -> RunLock:
        import fcntl

        from danka.errors import output_dir_error

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, OPEN_MODE)
        except OSError as err:  # read-only filesystem, no permission, a file in the way
            raise output_dir_error(self.path.parent, err) from None
        os.close(fd)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, OPEN_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                pid = self._read_pid()
                who = f"pid {pid}" if pid else "another process"
                raise UserError(
                    f"another danka run ({who}) is using this output_dir",
                    where=str(self.path.parent),
                    fix=f"wait for it to finish or stop it (kill {pid or 'PID'}), or use a "
                    "different --output_dir",
                ) from None
            try:  # the holder may have removed the file between our open and flock
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            _refuse_orphaned_ranks(self.path.parent)
        except BaseException:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        old = self._read_pid()
        if old and old != os.getpid():
            self.took_over = old
            state = "no longer running" if not pid_alive(old) else "it no longer holds it"
            log.warning(f"taking over the run lock of pid {old} ({state}) in {self.path}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        _HELD.append(self)
        return self

    def still_held(self) -> bool:
        """True while ``OUTPUT/.danka.lock`` is still the file this lock holds (False once
        the output dir, or the lock file, was deleted or replaced under the live run)."""
        if self._fd is None:
            return False
        try:
            return os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file, then unlock (a waiting ``acquire`` re-checks the inode)."""
        if self._fd is None:
            return
        import fcntl

        if self in _HELD:
            _HELD.remove(self)
        try:
            if self.still_held():  # never remove the lock file of a run that took over
                self.path.unlink(missing_ok=True)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


_HELD: list[RunLock] = []  # the locks this process holds (check_run_lock reads them)


def check_run_lock(output_dir: str | Path, what: str = "files") -> None:
    """UserError (exit 2) if this process locked ``output_dir`` and no longer holds it:
    the folder was deleted (or its lock file replaced) while the run was alive, and maybe
    another run writes there now. ``what``: what the caller was about to write (named in
    the message). Nothing to check where this process holds no lock for it (a torchrun
    rank: the launcher holds it; a library call of ``fit``)."""
    path = Path(output_dir).resolve() / LOCK_NAME
    for lock in _HELD:
        if lock.path.resolve() != path or lock.still_held():
            continue
        if lock.path.exists():
            now = lock._read_pid()
            owner = f"now belongs to pid {now}" if now else "was replaced"
        else:
            owner = "is gone"
        raise UserError(
            f"this run's lock file {lock.path} {owner}: the output dir was deleted or "
            f"replaced while the run was training; {what} not written, so that two runs' "
            "files never mix in one folder",
            where=str(output_dir),
            fix="never delete the output_dir of a live run; stop it first, or start the new "
            "run with another --output-dir",
        )


RANKS_LOCK_NAME = ".danka.ranks.lock"  # shared-locked by every rank of a --nproc run


def _lock_holders(path: Path) -> list[int]:
    """pids that hold a lock on ``path`` (Linux ``/proc/locks``; empty elsewhere)."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[5].rsplit(":", 1)[-1] == str(inode):
            pid = int(fields[4]) if fields[4].isdigit() else None
            if pid and pid_alive(pid) and pid not in pids:
                pids.append(pid)
    return pids


def _refuse_orphaned_ranks(output_dir: Path) -> None:
    """UserError while processes of an earlier ``--nproc`` run still hold the ranks lock of
    ``output_dir`` (their launcher died: its run lock is free, but they may still write)."""
    import fcntl

    path = output_dir / RANKS_LOCK_NAME
    if not path.exists():
        return
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pids = _lock_holders(path)
        shown = " ".join(map(str, pids)) or "PID"
        raise UserError(
            f"processes of an earlier --nproc run (pids {shown}) are still running in this "
            "output_dir: its launcher is gone, but they could still write here",
            where=str(output_dir),
            fix=f"wait a few seconds (they stop when they notice), or end them: kill {shown}",
        ) from None
    finally:
        os.close(fd)  # closing drops the probe's lock


class RankLock:
    """``with RankLock(output_dir):`` in each rank of a ``--nproc`` run (its launcher holds
    the :class:`RunLock`). Every rank holds a SHARED lock on ``OUTPUT/.danka.ranks.lock``
    for its whole life, so a new run is refused while any rank lives, even after the
    launcher was killed (``kill -9``: the run lock died with it); and a watchdog thread
    ends the rank within a second of its launcher's death, so orphaned ranks never linger."""

    POLL_S = 0.5

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / RANKS_LOCK_NAME
        self._fd: int | None = None
        raw = os.environ.get(LOCK_HELD_ENV, "")
        self.launcher = int(raw) if raw.isdigit() else None

    def __enter__(self) -> RankLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, OPEN_MODE)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        if self.launcher is not None:
            if not pid_alive(self.launcher):  # died before we held the lock: never start
                os._exit(1)
            threading.Thread(target=self._watch, daemon=True).start()
        return self

    def _watch(self) -> None:
        import time

        while pid_alive(self.launcher):  # type: ignore[arg-type]
            time.sleep(self.POLL_S)
        print(
            f"danka: rank {os.environ.get('RANK', '?')}: the launcher (pid {self.launcher}) "
            "is gone; stopping",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the last descriptor
            self._fd = None


_current_stop: StopRequest | None = None


def current_stop() -> StopRequest | None:
    """The active :class:`StopRequest` (None outside one): the loop polls ``.requested``."""
    return _current_stop


class StopRequest:
    """``with StopRequest() as stop:`` -- SIGTERM/SIGINT set ``stop.signum`` instead of
    killing the process; the loop checks ``stop.requested`` after each step, saves a
    checkpoint and returns; the caller exits with ``stop.exit_code``. A second signal
    aborts at once (KeyboardInterrupt for SIGINT, SystemExit(143) for SIGTERM), and so does
    a signal that comes before anyone read ``requested`` (model loading: nothing to save
    yet; or a loop that does not poll: the signal is never swallowed).

    Handlers can only be installed from the main thread; elsewhere this is a no-op flag.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, log: logging.Logger | None = None):
        self.signum: int | None = None
        self._polled = False  # has the loop read .requested yet?
        self._old: dict[int, object] = {}
        self._log = log or logging.getLogger("danka")

    @property
    def requested(self) -> bool:
        self._polled = True
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum is not None else 0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None or not self._polled:  # stop now, no checkpoint
            why = "again" if self.signum is not None else "before the first step ended"
            self.signum = self.signum or signum
            self._log.warning(
                f"{signal.Signals(signum).name} received {why}: stopping now "
                "without a checkpoint (the last saved one is intact)"
            )
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum
        self._log.warning(
            f"{self.name} received: saving a checkpoint after this step, "
            f"then exiting with code {self.exit_code} (Ctrl-C again to abort without saving)"
        )

    def __enter__(self) -> StopRequest:
        global _current_stop
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        _current_stop = self
        return self

    def __exit__(self, *exc) -> None:
        global _current_stop
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        if _current_stop is self:
            _current_stop = None


def note_failure(output_dir: str | Path, err: BaseException) -> None:
    """A run that stops on ``err``: the CLI's message goes to ``OUTPUT/logs/train.log`` too
    (the ``danka: error:`` line for bad input or a training fault, the traceback for a
    bug), and outputs of a run that never finished a step are removed
    (:func:`discard_unstarted_outputs`). A signal (SystemExit/KeyboardInterrupt) is
    logged by :class:`StopRequest`; it only gets the clean-up."""
    import traceback

    from danka.errors import as_user_error

    output_dir = Path(output_dir)
    try:
        discard_unstarted_outputs(output_dir)
    except OSError:
        pass
    if not isinstance(err, Exception):
        return
    user = as_user_error(err)
    if user is not None:
        text = f"[ERROR] danka: error: {user}"
    else:
        text = "[ERROR] " + "".join(traceback.format_exception(err)).rstrip()
    log_file = output_dir / "logs" / "train.log"
    if log_file.parent.is_dir():
        try:
            with open(log_file, "a", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError:
            pass


def discard_unstarted_outputs(output_dir: Path) -> list[str]:
    """Remove what a run wrote before its first step was done, when it stops there: an
    empty ``metrics.jsonl``, the step-0 evaluation, completions. Only where the output
    dir holds no checkpoint and ``metrics.jsonl`` no complete step (a resumed run keeps
    everything). ``config.json`` and ``logs/`` stay. Returns the removed names."""
    import shutil

    metrics, state = output_dir / "metrics.jsonl", output_dir / "state"  # checkpoint.store
    if state.is_dir() and any(state.iterdir()):
        return []
    if metrics.is_file():
        with open(metrics, "rb") as f:
            if b"\n" in f.read(1 << 20):
                return []
    removed = []
    for name in ("metrics.jsonl", "eval", "completions"):
        path = output_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


def run_forwarding_signals(argv: list[str], env: dict | None = None) -> int:
    """Run ``argv`` in its own process group, forward SIGTERM/SIGINT to it, wait for it.

    Own group: a terminal's Ctrl-C reaches the child once (from us), not twice. A signal
    goes to the child's children (torchrun's ranks) where there are any, else to the child.
    Returns the child's exit code; 128+signal if the child was killed by one, or if we
    forwarded one and the child then ended with any other code (0 included: ranks that
    saved and stopped cleanly exit 0).
    """
    proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        # to the ranks themselves (torchrun's children): each saves after its step as one
        # process does; torchrun, signalled, would SIGKILL them 30 s later, mid-step
        from danka.usercode.subprocs import children

        targets = children(proc.pid) or [proc.pid]  # no ranks yet: torchrun stops them
        for pid in targets:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler replaced SIGINT
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if rc < 0:
        return 128 - rc
    if got and rc not in (EXIT_INTERRUPTED, EXIT_TERMINATED):  # ranks that stopped cleanly exit 0
        return 128 + got[0]
    return rc
