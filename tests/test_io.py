"""danka.io: the one atomic writer and the one mode rule for every file danka writes."""

from __future__ import annotations

import contextlib
import os

import pytest

from danka.io import atomic_path, new_file_mode, new_folder_mode, temp_folder, write_text_atomic


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_atomic_writes_get_the_mode_a_new_file_gets_from_the_umask(tmp_path, mask, mode):
    """mkstemp makes 0600 files: result.json, eval/step_N.json and `danka eval --output`
    were unreadable by others while metrics.jsonl and checkpoints were 0644."""
    path = tmp_path / "result.json"
    path.write_text("old")
    path.chmod(0o600)  # what the old writer left: replaced, the mode is the rule's
    with umask(mask):
        assert new_file_mode() == mode
        write_text_atomic(path, "{}")
        with atomic_path(tmp_path / "model.bin") as tmp:
            tmp.write_bytes(b"x")
        with open(tmp_path / "plain.txt", "w"):  # what open() gives: the same rule
            pass
    for name in ("result.json", "model.bin", "plain.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name


@pytest.mark.parametrize("mask, mode", [(0o022, 0o755), (0o027, 0o750)])
def test_a_temporary_folder_gets_the_mode_a_new_folder_gets(tmp_path, mask, mode):
    """mkdtemp makes 0700 folders: a model folder renamed into place (a GGUF conversion,
    an export) was hidden from others sharing the cache or the output."""
    with umask(mask):
        assert new_folder_mode() == mode
        folder = temp_folder(tmp_path, ".tmp-model-")
    assert folder.parent == tmp_path and folder.name.startswith(".tmp-model-")
    assert folder.is_dir() and not any(folder.iterdir())
    assert folder.stat().st_mode & 0o777 == mode
