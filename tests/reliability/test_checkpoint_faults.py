"""Checkpoints under faults: an edited or damaged checkpoint on resume is set aside and
reported (never deleted), keep_last counts only verified checkpoints, a full disk during a
save is exit 3 with danka's message, checkpoint files are readable by others (0644), and a
planted pickle is refused with the file's name."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from danka.checkpoint import find_latest_checkpoint, save_checkpoint, verify_checkpoint
from danka.checkpoint.store import CheckpointDiskFull
from tests.checkpoint.test_checkpoint_safety import _save
from tests.trainer.conftest import train_cli

from .conftest import REPO, assert_user_error, child_env, danka, edit_config, one_step_config


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, model_dir) -> Path:
    """A finished 2-step run with a checkpoint after each step (copied by each test)."""
    root = tmp_path_factory.mktemp("two_steps")
    config = one_step_config(root, model_dir, trainer={"total_steps": 2, "save_steps": 1})
    assert train_cli(config, root / "out") == 0
    return root


def _copy(two_steps: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "run"
    shutil.copytree(two_steps, root)
    edit_config(root / "config.yaml", output_dir=str(root / "out"))
    return root / "config.yaml", root / "out"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_an_edited_newest_checkpoint_is_set_aside_not_deleted(two_steps, tmp_path):
    """The red team's case: the base path in checkpoint_2's adapter_config.json set to the
    hub id (as before an upload). Before: resume removed checkpoint_2."""
    config, out = _copy(two_steps, tmp_path)
    adapter_config = out / "actor" / "checkpoint_2" / "adapter_config.json"
    meta = json.loads(adapter_config.read_text())
    meta["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    adapter_config.write_text(json.dumps(meta))
    edited = {part: _files(out / part / "checkpoint_2") for part in ("actor", "state")}
    first = _files(out / "actor" / "checkpoint_1")

    assert train_cli(config, out, "--resume", "auto") == 0
    log = (out / "logs" / "train.log").read_text()
    assert "set aside checkpoint_2" in log and "nothing deleted" in log
    for part, files in edited.items():
        [aside] = (out / part).glob("checkpoint_2.unverified-*")
        assert _files(aside) == files, f"{part}: the user's checkpoint changed"
    assert _files(out / "actor" / "checkpoint_1") == first
    assert find_latest_checkpoint(out) == out / "state" / "checkpoint_2"  # retrained, verified
    verify_checkpoint(out / "state" / "checkpoint_1")


# ---------------------------------------------------------------- keep_last


def _steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (out / "state").glob("checkpoint_*"))


def test_keep_last_counts_only_verified_checkpoints(tmp_path):
    """Before: a damaged checkpoint counted, and keep_last deleted the intact one before it
    (and the damaged one later)."""
    for step in (1, 2):
        _save(tmp_path, step)
    damaged = tmp_path / "actor" / "checkpoint_2" / "adapter_model.safetensors"
    damaged.write_bytes(b"x" * 10)
    _save(tmp_path, 3, keep_last=2)
    assert _steps(tmp_path) == [1, 2, 3]  # 3 and 1 verify (kept), 2 fails (kept, uncounted)
    assert damaged.read_bytes() == b"x" * 10
    _save(tmp_path, 4, keep_last=2)
    assert _steps(tmp_path) == [2, 3, 4]


def test_damaged_checkpoints_never_push_out_the_one_a_resume_started_from(tmp_path):
    """A run resumed from checkpoint 1 while 2 and 3 are damaged: with keep_last=2 the
    next save keeps 4 and 1 (the two that verify). Before: 4 and 3 were kept, 1 deleted."""
    for step in (1, 2, 3):
        _save(tmp_path, step)
    for step in (2, 3):
        (tmp_path / "actor" / f"checkpoint_{step}" / "adapter_model.safetensors").write_bytes(b"x")
    _save(tmp_path, 4, keep_last=2)
    assert _steps(tmp_path) == [1, 2, 3, 4]
    verify_checkpoint(tmp_path / "state" / "checkpoint_1")


# ---------------------------------------------------------------- disk full


def test_a_full_disk_reported_by_safetensors_is_danka_s_disk_full(tmp_path):
    """safetensors says SafetensorError '... No space left on device (os error 28)', not an
    OSError; before, the error escaped as a traceback (exit 1)."""
    from safetensors import SafetensorError

    _save(tmp_path, 1)

    def full(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(b"half")
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    with pytest.raises(
        CheckpointDiskFull, match="no space left on the device while saving checkpoint 2"
    ) as err:
        save_checkpoint(tmp_path, 2, {"actor": full}, trainer_state={}, config_hash="h", keep_last=None)  # fmt: skip
    assert err.value.exit_code == 3
    assert not list(tmp_path.glob("*/.tmp-*"))
    verify_checkpoint(tmp_path / "state" / "checkpoint_1")


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True
    )
    return probe.returncode == 0


VERIFY = "from danka.checkpoint import verify_checkpoint; import sys; verify_checkpoint(sys.argv[1]); print('checkpoint_1 intact')"


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs a private tmpfs mount (unshare -m, root)")
def test_disk_full_during_a_real_save_exits_3_and_keeps_the_earlier_checkpoint(tmp_path, model_dir):
    config = one_step_config(tmp_path, model_dir, trainer={"total_steps": 4, "save_steps": 1})
    out = tmp_path / "small_disk"
    out.mkdir()
    script = textwrap.dedent(f"""\
        mount -t tmpfs -o size=176k tmpfs {out} || exit 99
        {sys.executable} -m danka train {config} --output-dir {out} logging.save_completions=0
        rc=$?
        {sys.executable} -c "{VERIFY}" {out}/state/checkpoint_1
        exit $rc
        """)  # fmt: skip
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 3, text[-3000:]
    assert "Traceback" not in text
    assert "no space left on the device while saving checkpoint" in text and "fix:" in text
    assert "checkpoint_1 intact" in text


# ---------------------------------------------------------------- file modes, pickles


def test_checkpoint_files_are_readable_by_others(tmp_path):
    """Before: manifest.json came from mkstemp, mode 0600."""
    old = os.umask(0o022)
    try:
        state = _save(tmp_path, 1)
    finally:
        os.umask(old)
    files = [p for part in ("actor", "state") for p in (tmp_path / part).rglob("*") if p.is_file()]
    assert state / "manifest.json" in files
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o644, path


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def _plant(path: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump({"step": 2, "x": _Payload()}, f)


def test_a_planted_trainer_state_pickle_is_refused_with_its_name(two_steps, tmp_path):
    """The manifest updated to match, so verification passes and torch.load is reached.
    Before: weights_only refused it with a traceback that named no file."""
    from danka.checkpoint.store import _hash_tree

    config, out = _copy(two_steps, tmp_path)
    state = out / "state" / "checkpoint_2"
    _plant(state / "trainer_state.pt")
    manifest = json.loads((state / "manifest.json").read_text())
    manifest["parts"]["state"]["files"] = _hash_tree(state)
    (state / "manifest.json").write_text(json.dumps(manifest))
    done = danka("train", str(config), "--resume", "auto", "trainer.total_steps=3", cwd=tmp_path)
    assert_user_error(done, str(state / "trainer_state.pt"), "weights_only")
    assert not (tmp_path / "PWNED").exists()


def test_export_of_an_adapter_that_is_a_pickle_is_refused_with_its_name(two_steps, tmp_path):
    _, out = _copy(two_steps, tmp_path)
    adapter = out / "actor" / "checkpoint_2"
    (adapter / "adapter_model.safetensors").unlink()
    _plant(adapter / "adapter_model.bin")
    done = danka(
        "export", "--adapter", str(adapter), "--output", str(tmp_path / "merged"), cwd=tmp_path
    )
    assert_user_error(done, str(adapter / "adapter_model.bin"), "pickle")
    assert not (tmp_path / "PWNED").exists()
