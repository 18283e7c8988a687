"""Checkpoint faults: foreign folders are never pruned, manifests are checked before they are
trusted, a full disk ends in exit 3 with nothing left behind, directories are fsynced, the
size is printed, and the default save cadence."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import danka.io
from danka.checkpoint import find_latest_checkpoint, save_checkpoint, store
from danka.checkpoint.cadence import save_due, save_interval
from danka.checkpoint.retention import newer_checkpoints
from danka.checkpoint.store import CheckpointDiskFull, checkpoint_size, verify_checkpoint
from danka.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def _writer(data: bytes):
    def write(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(data)

    return write


def _save(out: Path, step: int, keep_last: int | None = None) -> Path:
    return save_checkpoint(
        out,
        step,
        {"actor": _writer(b"A" * 100)},
        trainer_state={"step": step},
        config_hash="h",
        keep_last=keep_last,
    )


def _edit_manifest(state_dir: Path, edit) -> None:
    path = state_dir / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


# ---------------------------------------------------------------- only our own folders


def test_keep_last_never_deletes_a_foreign_checkpoint_folder(tmp_path):
    """Old code deleted any `checkpoint_<N>` under output_dir as an 'orphan'."""
    mine = tmp_path / "my_models" / "checkpoint_1"  # a user's own folder in the output dir
    mine.mkdir(parents=True)
    (mine / "weights.bin").write_bytes(b"precious")
    foreign_actor = tmp_path / "actor" / "checkpoint_0"  # not written by danka
    foreign_actor.mkdir(parents=True)
    foreign_state = tmp_path / "state" / "checkpoint_0"  # no manifest, no parts.json
    foreign_state.mkdir(parents=True)
    (foreign_state / "notes.txt").write_text("mine")
    for step in (1, 2, 3):
        _save(tmp_path, step, keep_last=1)
    assert (mine / "weights.bin").read_bytes() == b"precious"
    assert foreign_actor.is_dir() and (foreign_state / "notes.txt").exists()
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "checkpoint_0",
        "checkpoint_3",
    ]


def test_crash_leftover_of_our_own_is_still_pruned(tmp_path):
    """A save killed before its manifest (parts.json written) is danka's: pruned later."""
    first = _save(tmp_path, 1)
    (first / "manifest.json").unlink()  # as if killed before step 3 of the protocol
    _save(tmp_path, 2, keep_last=1)
    assert not (tmp_path / "actor" / "checkpoint_1").exists()
    assert not first.exists()


def test_sweep_only_removes_danka_temp_names(tmp_path):
    (tmp_path / "actor").mkdir()
    ours = tmp_path / "actor" / ".tmp-checkpoint_7-0123abcd"  # older danka: no pid
    theirs = tmp_path / "actor" / ".tmp-checkpoint_notes"
    ours.mkdir()
    theirs.mkdir()
    _save(tmp_path, 1)
    assert not ours.exists() and theirs.exists()


def test_sweep_spares_the_save_of_a_live_process_only(tmp_path):
    """``.tmp-checkpoint_<N>-<pid>-<hex>``: a dead pid's folder is a crash leftover (swept),
    a live other process's is a save in progress (kept)."""
    (tmp_path / "actor").mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        busy = tmp_path / "actor" / f".tmp-checkpoint_7-{live.pid}-0123abcd"
        left = tmp_path / "actor" / f".tmp-checkpoint_7-{dead.pid}-0123abcd"
        old = tmp_path / "actor" / f".tmp-old-checkpoint_7-{dead.pid}-0123abcd"
        for d in (busy, left, old):
            d.mkdir()
        _save(tmp_path, 1)
        assert busy.exists() and not left.exists() and not old.exists()
    finally:
        live.kill()
        live.wait()


SAVE_IN_ANOTHER_RUN = """
import sys
from pathlib import Path
from danka.checkpoint import save_checkpoint
save_checkpoint(Path(sys.argv[1]), 5, {"actor": lambda d: (d / "w.bin").write_bytes(b"B")},
                trainer_state={"step": 5}, config_hash="h", keep_last=None)
"""


def test_another_process_saving_meanwhile_leaves_our_save_in_progress_alone(tmp_path):
    """The calculator CPU run's FileNotFoundError on ``state/.tmp-checkpoint_6-*/parts.json``:
    a second run in the same folder (the first one's lock was deleted with the folder)
    finished a save while the first was writing checkpoint 6, and its sweep of crash
    leftovers deleted the first one's temporary folders. Here the other run's save runs
    in a real process in the middle of our actor writer."""

    def actor(folder: Path) -> None:
        (folder / "w.bin").write_bytes(b"A")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-c", SAVE_IN_ANOTHER_RUN, str(tmp_path)]
        subprocess.run(cmd, env=env, check=True, timeout=120)

    ours = save_checkpoint(
        tmp_path, 6, {"actor": actor}, trainer_state={"step": 6}, config_hash="h", keep_last=None
    )
    verify_checkpoint(ours)  # complete: every file of every part is there
    verify_checkpoint(tmp_path / "state" / "checkpoint_5")  # and so is the other one
    assert (tmp_path / "actor" / "checkpoint_6" / "w.bin").read_bytes() == b"A"


# ---------------------------------------------------------------- manifests are checked


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: m["parts"]["actor"].pop("files"), "missing 'files'"),
        (lambda m: m.pop("parts"), "missing 'parts'"),
        (lambda m: m["parts"]["actor"].update(dir="/tmp/elsewhere"), "points to"),
        (lambda m: m["parts"]["actor"].update(dir="../victim/checkpoint_2"), "points to"),
        (
            lambda m: m["parts"]["actor"]["files"].update(
                {"/etc/passwd": {"sha256": "0", "size": 1}}
            ),
            "leaves the checkpoint",
        ),
        (
            lambda m: m["parts"]["actor"]["files"].update({"../../x": {"sha256": "0", "size": 1}}),
            "leaves the checkpoint",
        ),
        (lambda m: m["parts"].update({"../victim": m["parts"]["actor"]}), "plain folder name"),
    ],
)
def test_malformed_manifest_is_an_incomplete_checkpoint(tmp_path, caplog, edit, words):
    """Old code: KeyError traceback on a manifest without `files`; trusted part paths."""
    _save(tmp_path, 1)
    second = _save(tmp_path, 2)
    _edit_manifest(second, edit)
    with caplog.at_level(logging.WARNING, logger="danka.checkpoint"):
        assert find_latest_checkpoint(tmp_path) == tmp_path / "state" / "checkpoint_1"
    assert "checkpoint_2" in caplog.text and words in caplog.text
    with pytest.raises(UserError, match="incomplete or corrupted"):
        store.verify_checkpoint(second)


def test_pruning_never_follows_a_manifest_outside_the_output_dir(tmp_path):
    """Old code: a part named `../victim` in a manifest made keep_last delete ../victim/..."""
    out = tmp_path / "out"
    victim = tmp_path / "victim" / "checkpoint_1"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("x")
    first = _save(out, 1)
    _edit_manifest(first, lambda m: m["parts"].update({"../victim": m["parts"]["actor"]}))
    _save(out, 2, keep_last=1)
    _save(out, 3, keep_last=1)
    assert (victim / "keep.txt").exists()


# ---------------------------------------------------------------- a full disk


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_in_a_writer_is_exit_3_with_the_space_needed(tmp_path):
    _save(tmp_path, 1)
    with pytest.raises(CheckpointDiskFull) as err:
        save_checkpoint(
            tmp_path, 2, {"actor": _enospc}, trainer_state={}, config_hash="h", keep_last=None
        )
    assert err.value.exit_code == 3
    text = str(err.value)
    assert "no space left" in text and "needs about" in text and "free" in text
    assert not list(tmp_path.rglob(".tmp-*"))
    assert find_latest_checkpoint(tmp_path) == tmp_path / "state" / "checkpoint_1"


def test_disk_full_writing_the_manifest_leaves_no_temp_file(tmp_path, monkeypatch):
    """Old code leaked `.manifest.json.tmp-*` and ended in a traceback."""
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith("manifest.json"):
            _enospc()
        return real_replace(src, dst)

    monkeypatch.setattr(store.os, "replace", replace)
    with pytest.raises(CheckpointDiskFull):
        _save(tmp_path, 1)
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert find_latest_checkpoint(tmp_path) is None


def test_parent_directories_are_fsynced_after_renames(tmp_path, monkeypatch):
    synced: list[Path] = []
    real = store.fsync_dir

    def spy(p):
        synced.append(Path(p))
        real(p)

    monkeypatch.setattr(store, "fsync_dir", spy)  # the store's own renames
    monkeypatch.setattr(danka.io, "fsync_dir", spy)  # the manifest's atomic write
    _save(tmp_path, 1)
    for folder in (tmp_path, tmp_path / "actor", tmp_path / "state"):
        assert folder in synced, folder  # new part folders, renamed checkpoint folders
    assert tmp_path / "state" / "checkpoint_1" in synced  # the manifest's rename


# ---------------------------------------------------------------- size, cadence, newer


def test_checkpoint_size_is_printed_when_saved(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="danka.checkpoint"):
        state_dir = _save(tmp_path, 1)
    size = checkpoint_size(state_dir)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "manifest.json"]
    assert size == sum(p.stat().st_size for p in files)
    assert f"({store.format_size(size)})" in caplog.text  # ~150 MB for a 7B LoRA adapter
    assert store.format_size(150 * 1024 * 1024) == "150.0 MB"
    assert store.format_size(1536) == "1.5 KB" and store.format_size(10) == "10 B"


def test_default_cadence_is_every_tenth_of_the_run():
    # save_steps null: ceil(200 * 0.1) = 20 -> steps 20, 40, ..., 200 (10 saves)
    assert [s for s in range(1, 201) if save_due(s, 200)] == list(range(20, 201, 20))
    assert save_interval(25, None) == 3  # ceil(2.5)
    assert save_interval(5, None) == 1
    # save_steps 0: only the last step; K: every K steps and the last
    assert [s for s in range(1, 11) if save_due(s, 10, save_steps=0)] == [10]
    assert [s for s in range(1, 11) if save_due(s, 10, save_steps=4)] == [4, 8, 10]
    # save_minutes is a clock: tests/trainer/test_clocks.py


def test_newer_checkpoints_lists_only_ours(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    (tmp_path / "state" / "checkpoint_9").mkdir()  # not danka's
    assert newer_checkpoints(tmp_path, 1) == ["checkpoint_2", "checkpoint_3"]
    assert newer_checkpoints(tmp_path, 3) == []
