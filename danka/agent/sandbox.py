"""Where the builtin ``python`` tool runs model-written code: ``agent.tool_sandbox``.

The code comes from the model, so it is treated as untrusted. Modes:

* ``bwrap``: bubblewrap (``bwrap``, when installed): new user, mount, network, PID, IPC
  and UTS namespaces; an empty root with read-only binds of the interpreter, /usr and
  /lib*; the snippet's temporary folder as /tmp, the only writable place; no network.
* ``namespaces``: the same through the kernel directly (``unshare``/``pivot_root`` from
  danka/agent/sandbox_setup.py), no tool needed; a real root drops to ``nobody`` inside.
* ``none``: a plain interpreter (``python -I``, environment cut to PATH and LANG, an empty
  temporary working folder): it CAN read and write the user's files and reach the
  network. Only ever chosen silently when the config says ``agent.tool_sandbox: none``.
* ``auto`` (default): the first of bwrap and namespaces that works here (as root,
  namespaces first: it drops to a real unprivileged uid, so the process limit holds),
  else ``none`` with a loud start-up warning (:func:`startup_warning`).

In every mode: a wall-clock timeout (the whole process tree is killed), and rlimits of
CPU seconds, 1 GiB address space, 16 MiB per written file, a process count and no core
files. Each mode is probed once per process by running a real snippet in it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from danka.agent.sandbox_setup import set_limits  # between fork and exec: no import there
from danka.errors import UserError

MODES = ("auto", "bwrap", "namespaces", "none")
MEMORY_BYTES = 1 << 30
FILE_BYTES = 16 << 20
EXTRA_PROCESSES = 32  # a snippet may start this many processes (RLIMIT_NPROC)
_SETUP = Path(__file__).with_name("sandbox_setup.py")
_FIX = (
    "install bubblewrap (apt install bubblewrap), or allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1), or run the trainer in a container; "
    "agent.tool_sandbox: none runs the code unconfined (you accept the risk)"
)


@dataclass(frozen=True)
class Snippet:
    """What one run gave: the captured output, the exit code (None: timed out)."""

    stdout: str
    stderr: str
    returncode: int | None


def _nobody() -> tuple[int, int]:
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return 65534, 65534


def _read_only_paths() -> list[str]:
    """What the interpreter needs: its prefix(es), the system libraries, the loader cache."""
    exe = os.path.realpath(sys.executable)
    paths = {sys.base_prefix, sys.prefix, os.path.dirname(exe)}
    paths |= {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache"}
    out = sorted(p for p in paths if os.path.lexists(p))
    # a folder inside another bound one is already there (binding it again is harmless,
    # but /usr/bin inside /usr must not be made a symlink over)
    return [p for p in out if not any(p != q and p.startswith(q + "/") for q in out)]


def _limits_spec(cpu_s: int) -> dict:
    return {
        "cpu_s": cpu_s,
        "memory": MEMORY_BYTES,
        "file_size": FILE_BYTES,
        "extra_processes": EXTRA_PROCESSES,
    }


def _bwrap_argv(code: str, work: str) -> list[str]:
    argv = [str(shutil.which("bwrap")), "--unshare-all", "--die-with-parent", "--new-session"]
    argv += ["--cap-drop", "ALL", "--clearenv"]
    for p in _read_only_paths():
        argv += ["--symlink", os.readlink(p), p] if os.path.islink(p) else ["--ro-bind", p, p]
    argv += ["--dev", "/dev", "--proc", "/proc", "--bind", work, "/tmp", "--chdir", "/tmp"]
    for key, value in (
        ("PATH", "/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
    ):
        argv += ["--setenv", key, value]
    argv += ["--remount-ro", "/"]  # the empty root itself too: only /tmp is writable
    return [*argv, os.path.realpath(sys.executable), "-I", "-c", code]


def run_snippet(code: str, mode: str, timeout_s: float) -> Snippet:
    """Run ``code`` in ``mode`` (bwrap, namespaces or none) with the limits above."""
    from danka.usercode.subprocs import kill_tree

    cpu_s = int(timeout_s) + 1
    with tempfile.TemporaryDirectory(prefix="danka-python-tool-") as tmp:
        work, root = os.path.join(tmp, "work"), os.path.join(tmp, "root")
        os.mkdir(work)
        os.mkdir(root)
        limits = _limits_spec(cpu_s)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        preexec = None
        if mode == "namespaces":
            spec = {
                "root": root,
                "work": work,
                "read_only": _read_only_paths(),
                "code": code,
                "python": os.path.realpath(sys.executable),
                "nobody": _nobody(),
                **limits,
            }
            argv = [sys.executable, "-I", "-S", str(_SETUP), json.dumps(spec)]
        elif mode == "bwrap":
            argv, preexec = _bwrap_argv(code, work), functools.partial(set_limits, limits)
        else:
            argv = [sys.executable, "-I", "-c", code]
            preexec = functools.partial(set_limits, limits)
        proc = subprocess.Popen(
            argv,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=preexec,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.communicate()
            return Snippet("", "", None)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
        return Snippet(out, err, proc.returncode)


@functools.cache
def works(mode: str) -> bool:
    """Does ``mode`` run a snippet here? Probed once: ``print(6 * 7)`` must print 42."""
    if mode == "none":
        return True
    if mode == "bwrap" and shutil.which("bwrap") is None:
        return False
    if mode == "namespaces" and not sys.platform.startswith("linux"):
        return False
    try:
        got = run_snippet("print(6 * 7)", mode, 20.0)
    except OSError:
        return False
    return got.returncode == 0 and got.stdout.strip() == "42"


def choose(requested: str) -> str:
    """The mode ``agent.tool_sandbox: requested`` runs with. UserError for an unknown
    name, or an explicit mode that does not work on this machine."""
    if requested not in MODES:
        raise UserError(
            f"{requested!r} is not a sandbox",
            where="agent.tool_sandbox",
            fix=f"use one of: {', '.join(MODES)}",
        )
    if requested != "auto":
        if not works(requested):
            raise UserError(
                f"agent.tool_sandbox: {requested} does not work on this machine "
                + (
                    "(no bwrap on PATH)"
                    if requested == "bwrap" and not shutil.which("bwrap")
                    else "(the probe snippet failed)"
                ),
                where="agent.tool_sandbox",
                fix="use auto (the best that works) or " + _FIX,
            )
        return requested
    order = ("namespaces", "bwrap") if os.geteuid() == 0 else ("bwrap", "namespaces")
    return next((m for m in order if works(m)), "none")


def startup_warning(requested: str, chosen: str) -> str | None:
    """The loud line for the builtin python tool running unconfined, unless the config
    accepted that explicitly (``agent.tool_sandbox: none``)."""
    if chosen != "none" or requested == "none":
        return None
    return (
        "the builtin python tool runs model-written code UNSANDBOXED: no bubblewrap and no "
        "usable Linux namespaces here, so that code can read and write your files and reach "
        f"the network. To fix: {_FIX}"
    )
