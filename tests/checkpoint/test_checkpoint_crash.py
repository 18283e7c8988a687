"""A process SIGKILLed in the middle of save_checkpoint leaves the previous checkpoint as the
latest complete one, and a later save of the same step succeeds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from danka.checkpoint import find_latest_checkpoint, save_checkpoint, verify_checkpoint

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from danka.checkpoint import save_checkpoint

    out, ready = Path(sys.argv[1]), Path(sys.argv[2])

    def good(folder):
        (folder / "a.safetensors").write_bytes(b"a" * 1000)
        (folder / "b.json").write_text("{}")

    def slow(folder):
        (folder / "a.safetensors").write_bytes(b"new" * 1000)
        ready.write_text("half written")  # tell the test to kill us now
        time.sleep(60)
        (folder / "b.json").write_text("{}")

    save_checkpoint(out, 1, {"actor": good}, trainer_state={"step": 1}, config_hash="h",
                    keep_last=2)
    save_checkpoint(out, 2, {"critic": good, "actor": slow}, trainer_state={"step": 2},
                    config_hash="h", keep_last=2)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_during_save(tmp_path):
    ready = tmp_path / "ready"
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out), str(ready)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, "child exited before reaching the slow writer"
            assert time.monotonic() < deadline, "child never reached the slow writer"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    latest = find_latest_checkpoint(out)
    assert latest == out / "state" / "checkpoint_1"
    verify_checkpoint(latest)
    assert list(out.glob("*/.tmp-checkpoint_2-*"))  # the killed attempt's leftovers

    # the resumed run redoes step 2: it completes and cleans up the leftovers
    def writer(folder: Path) -> None:
        (folder / "a.safetensors").write_bytes(b"redo")

    save_checkpoint(
        out, 2, {"actor": writer}, trainer_state={"step": 2}, config_hash="h", keep_last=2
    )
    assert find_latest_checkpoint(out) == out / "state" / "checkpoint_2"
    assert not list(out.glob("*/.tmp-*"))
    assert (out / "state" / "checkpoint_1" / "manifest.json").exists()


def test_a_kill_inside_keep_last_delete_leaves_nothing_the_next_save_cannot_clear(
    tmp_path, monkeypatch
):
    """keep_last deletes checkpoint_1's state folder; the process dies half-way through
    that delete (the file holding parts.json already gone). The next save must still
    remove what is left: before, the half-deleted ``state/checkpoint_1`` had neither a
    manifest nor parts.json and stayed forever (seen in the SIGKILL-and-resume test)."""
    import shutil

    from danka.checkpoint import store

    out = tmp_path / "out"

    def writer(folder: Path) -> None:
        (folder / "a.safetensors").write_bytes(b"a" * 100)

    for step in (1, 2):
        _save(out, step, writer)
    real_rmtree = shutil.rmtree

    class Killed(BaseException):
        pass

    def dies_in_state(path, *args, **kwargs):
        path = Path(path)
        if path.parent.name == "state":  # remove parts.json, then "die"
            for f in path.iterdir():
                if f.name == "parts.json":
                    f.unlink()
            raise Killed
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(store.shutil, "rmtree", dies_in_state)
    with pytest.raises(Killed):
        _save(out, 3, writer)
    monkeypatch.setattr(store.shutil, "rmtree", real_rmtree)
    assert not (out / "state" / "checkpoint_1").exists()  # renamed away before the delete
    # the resumed run saves again: the leftovers of the interrupted delete are swept
    _save(out, 4, writer)
    names = sorted(p.name for part in out.iterdir() if part.is_dir() for p in part.iterdir())
    assert names == ["checkpoint_3", "checkpoint_3", "checkpoint_4", "checkpoint_4"]


def _save(out: Path, step: int, writer) -> None:
    save_checkpoint(
        out, step, {"actor": writer}, trainer_state={"step": step}, config_hash="h", keep_last=2
    )
