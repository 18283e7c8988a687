"""A ``.gguf`` conversion under hostile conditions: SIGTERM in the middle (the temporary
folder goes, exit 143), ``kill -9`` in the middle (the next conversion removes what it
left, never a live one's), a cache on a read-only filesystem or through a file, a pipe or
a device where the ``.gguf`` should be."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from danka.errors import UserError
from danka.models import gguf, loading
from tests.models.test_gguf import write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
# Test hook: the conversion sleeps (after its temporary folder exists) and says so.
HOOK = """
import os, sys, time
mark = os.environ.get("DANKA_TEST_CONVERTING")
if mark:
    import danka.models.gguf as g
    real = g.check_readable
    def slow(path):
        open(mark, "w").write(str(os.getpid()))
        time.sleep(60)
        return real(path)
    g.check_readable = slow
"""


def _start(tmp_path: Path, gguf_file: Path, cache: Path) -> tuple[subprocess.Popen, Path]:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    mark = tmp_path / "converting"
    mark.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}", "DANKA_CACHE": str(cache),
           "DANKA_TEST_CONVERTING": str(mark), "OMP_NUM_THREADS": "1"}  # fmt: skip
    argv = ["generate", "--model", str(gguf_file), "--prompt", "hi", "--max-new-tokens", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "danka", *argv], env=env,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    end = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < end and proc.poll() is None:
        time.sleep(0.1)
    assert mark.exists(), proc.stderr.read() if proc.poll() is not None else "no conversion"
    return proc, mark


def _temporaries(cache: Path) -> list[str]:
    models = cache / "models"
    return (
        [p.name for p in models.iterdir() if p.name.startswith(".tmp-")] if models.is_dir() else []
    )


def test_sigterm_during_a_conversion_removes_its_temporary_folder(tmp_path):
    """Before: the default action killed it (exit -15) and every interrupted conversion
    left a .tmp-gguf-* folder in the cache for good."""
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    proc, _ = _start(tmp_path, path, cache)
    assert _temporaries(cache)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert "terminated" in err and "Traceback" not in err
    assert _temporaries(cache) == []


def test_the_next_conversion_removes_what_a_killed_one_left(tmp_path):
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    proc, _ = _start(tmp_path, path, cache)
    proc.kill()  # SIGKILL: no clean-up runs
    proc.wait(timeout=30)
    left = _temporaries(cache)
    assert left
    models = cache / "models"
    live = Path(tempfile.mkdtemp(prefix=".tmp-gguf-live-", dir=models))
    held = gguf._hold(live)  # a conversion in progress (another open file: flock conflicts)
    try:
        removed = gguf.sweep_orphans(models, log=lambda s: None)
        assert sorted(removed) == sorted(left) and live.is_dir()
    finally:
        os.close(held)
    assert gguf.sweep_orphans(models, log=lambda s: None) == [live.name]  # its process ended


def test_a_cache_through_a_file_is_one_message(tmp_path, monkeypatch):
    """Before: a FileExistsError / NotADirectoryError traceback (exit 1)."""
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for cache in (blocker, blocker / "sub"):
        monkeypatch.setenv("DANKA_CACHE", str(cache))
        with pytest.raises(UserError, match="DANKA_CACHE") as err:
            loading.load_causal_lm(str(path), log=lambda s: None)
        assert "fix:" in str(err.value)


def test_a_read_only_cache_is_one_message(tmp_path, monkeypatch):
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(UserError, match="DANKA_CACHE=.*read-only filesystem"):
        loading.load_causal_lm(str(path), log=lambda s: None)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_gguf_path_that_is_no_file_says_what_it_is(tmp_path, monkeypatch, capsys, kind):
    """Before: a pipe or /dev/zero was reported as 'does not exist'."""
    from danka.cli import main

    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
        (path / "x").write_text("x")
    assert main(["generate", "--model", str(path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" not in err and str(path) in err and "fix:" in err, err


def test_a_model_folder_with_a_pipe_inside_is_refused_without_blocking(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    with pytest.raises(UserError, match="named pipe"):
        loading.load_causal_lm(str(folder), log=lambda s: None)
