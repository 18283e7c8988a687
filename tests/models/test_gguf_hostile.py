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


def damaged_ggufs(folder: Path) -> dict[str, Path]:
    """Six ways a .gguf file is damaged, built from a good tiny one: empty, a wrong magic,
    cut at 64 KiB, a header claiming 2**60 tensors or 2**60 keys, a first key 2**62 bytes
    long (the header: magic, version, tensor count, key count, then the first key's length)."""
    import struct

    good = write_tiny_gguf(folder / "good" / "tiny.gguf")[0].read_bytes()
    tensors, keys = struct.unpack("<QQ", good[8:24])
    damaged = {
        "empty": b"",
        "magic": b"XXXX" + good[4:],
        "truncated": good[:65536],
        "tensors": good[:8] + struct.pack("<QQ", 2**60, keys) + good[24:],
        "keys": good[:8] + struct.pack("<QQ", tensors, 2**60) + good[24:],
        "key_length": good[:24] + struct.pack("<Q", 2**62) + good[32:],
    }
    for name, data in damaged.items():
        (folder / f"{name}.gguf").write_bytes(data)
    return {name: folder / f"{name}.gguf" for name in damaged}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path]:
    return damaged_ggufs(tmp_path_factory.mktemp("damaged_gguf"))


DAMAGED = ["empty", "magic", "truncated", "tensors", "keys", "key_length"]
# what the header of each damaged file claims, as the message names it
CLAIMS = {
    "tensors": f"{2**60:,} tensors",
    "keys": f"{2**60:,} keys",
    "key_length": f"a key of {2**62:,} bytes",
}


@pytest.mark.parametrize("kind", DAMAGED)
def test_the_shape_reader_refuses_a_damaged_gguf_like_the_loader(damaged, kind):
    """Before: danka estimate read the header through transformers unchecked: a ValueError
    traceback (exit 1) for an empty file or a wrong magic, 'this JSON file is broken' for
    the rest. Now one reader (gguf.check_gguf) refuses each, as danka generate did; a
    header that claims more than the file can hold says so (it said 'IndexError: index 0
    is out of bounds for axis 0 with size 0')."""
    from danka.planning.shape import load_model_config

    with pytest.raises(UserError) as err:
        load_model_config(str(damaged[kind]))
    assert err.value.where == str(damaged[kind]) and "GGUF" in err.value.what
    assert "JSON" not in str(err.value)
    if kind in CLAIMS:
        assert f"its header claims {CLAIMS[kind]}, more than" in err.value.what, err.value.what
        assert "Error" not in err.value.what


@pytest.mark.parametrize("kind", DAMAGED)
def test_danka_estimate_of_a_damaged_gguf_is_exit_2_and_one_message(
    damaged, tmp_path, capsys, monkeypatch, kind
):
    """Before the shape reader checked the file: exit 1 and a traceback. Then exit 2, but
    the message came twice: once inside 'prompts priced at the config's bound: the
    training prompts were not read (...)' (the prompts' tokenizer is the model's), then
    as the error."""
    from danka.cli import main

    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model:\n  actor_model_name_or_path: {damaged[kind]}\ndata:\n  task: arithmetic\n"
    )
    assert main(["estimate", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"danka: error: {damaged[kind]}: "), err
    assert err.count("cannot read the GGUF file") == 1 and "fix:" in err, err
    assert "Traceback" not in err and "prompts priced" not in err
