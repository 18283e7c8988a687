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
  group and forwards SIGTERM/SIGINT to it; the child gets SIGTERM if this process dies.

Exit codes of ``danka`` (README, "Exit codes"): 0 done, 2 bad input, 3 training fault,
130 interrupted (SIGINT/Ctrl-C), 143 terminated (SIGTERM).
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

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143

LOCK_NAME = ".danka.lock"
LOCK_HELD_ENV = "DANKA_RUN_LOCK_HELD"  # set for children of a launcher that holds the lock

log = logging.getLogger("danka.lifecycle")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


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

        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
            self.signum = self.signum or signum
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

    Own group: a terminal's Ctrl-C reaches the child once (from us), not twice. Returns the
    child's exit code; 128+signal if the child was killed by one (or if we forwarded one
    and the child then ended with a failure code of its own).
    """
    proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        try:
            proc.send_signal(signum)
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
    if got and rc not in (0, EXIT_INTERRUPTED, EXIT_TERMINATED):
        return 128 + got[0]
    return rc


# ---------------------------------------------------------------- speed settings (trainer.*)


def _cuda_device(device) -> bool:
    import torch

    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def enable_tf32(enabled: bool, device) -> str | None:
    """``trainer.tf32: true`` -> ``torch.set_float32_matmul_precision('high')`` (TF32 tensor
    cores for float32 matmuls). Returns the line to log; UserError (exit 2) where TF32
    does not exist (no CUDA GPU, or one older than Ampere) instead of a silent no-op."""
    if not enabled:
        return None
    import torch

    if not _cuda_device(device):
        raise UserError(
            "trainer.tf32 needs an NVIDIA GPU (Ampere or newer); this run is on "
            f"{torch.device(device).type}",
            where="trainer.tf32",
            fix="set trainer.tf32: false",
        )
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    if major < 8:
        raise UserError(
            f"trainer.tf32 needs compute capability 8.0+ (Ampere), this GPU is {major}.{minor}",
            where="trainer.tf32",
            fix="set trainer.tf32: false",
        )
    torch.set_float32_matmul_precision("high")
    return "TF32 matmuls on (torch.set_float32_matmul_precision('high'))"


def compile_forward(model, enabled: bool, device):
    """``trainer.compile: true`` -> the forward of the model's transformer body (what the
    training forward calls: ``get_decoder()``, through a PeftModel too; the LM head runs
    chunked outside it) becomes ``torch.compile(forward, dynamic=True)`` (dynamic: every
    step has other sequence lengths). Until session 5 ``model.forward`` was compiled,
    which the training forward never calls: a silent no-op. Only on a CUDA GPU: elsewhere
    UserError (exit 2). Returns the model."""
    if not enabled:
        return model
    import torch

    if not _cuda_device(device):
        raise UserError(
            f"trainer.compile is supported on a CUDA GPU only (this run is on "
            f"{torch.device(device).type})",
            where="trainer.compile",
            fix="set trainer.compile: false",
        )
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = base.get_decoder()
    body.forward = torch.compile(body.forward, dynamic=True)
    return model
