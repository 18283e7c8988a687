"""Crash-safe file writes: a temp file in the same folder, fsync, then an atomic rename,
so a reader (or a resumed run) sees the old file or the new one, never half of one. Every
file danka writes gets one mode, :func:`new_file_mode` (what ``open()`` gives a new file:
0644 under the usual umask 022), the atomic ones included; every folder it writes,
:func:`new_folder_mode` (0755), the temporary ones renamed into place included
(:func:`temp_folder`); a file it opens with ``os.open`` asks for :data:`OPEN_MODE`."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power cut (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


OPEN_MODE = 0o666  # what open() asks os.open for: the umask alone sets a new file's mode


def _umask() -> int:
    """This process's umask, read from /proc where it is shown: setting it to read it
    back would leave a window in which another thread's new file gets mode 0666."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode a new file gets from this process's umask (0644 under 022, 0640 under
    027). ``mkstemp``, which the atomic writes use, makes 0600 files, which others
    sharing a run folder (a job uploading the adapter, a colleague) could not read."""
    return OPEN_MODE & ~_umask()


def new_folder_mode() -> int:
    """The mode ``mkdir`` gives a new folder under this process's umask (0755 under 022);
    ``mkdtemp`` makes 0700 folders, which would hide what is renamed into place."""
    return 0o777 & ~_umask()


def temp_folder(parent: Path, prefix: str) -> Path:
    """A new empty folder in ``parent`` with a random name after ``prefix`` and the mode
    of any new folder (:func:`new_folder_mode`): write into it, then rename it into place
    (a whole model folder appears at once, or not at all). OSError as ``mkdtemp``'s."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        os.chmod(folder, new_folder_mode())
    except OSError:
        folder.rmdir()
        raise
    return folder


def apply_file_mode(root: Path) -> None:
    """Give ``root`` (a file) or every file under it (a folder) :func:`new_file_mode`:
    for what other libraries wrote their own way (safetensors makes 0600 files)."""
    mode = new_file_mode()
    for path in [root] if root.is_file() else root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


@contextlib.contextmanager
def atomic_path(path: Path, *, sync_dir: bool = False) -> Iterator[Path]:
    """Yields a temp path next to ``path`` (mode :func:`new_file_mode`); write it inside
    the block. On success it is fsynced and renamed onto ``path`` (and the folder fsynced
    with ``sync_dir``); on an error it is removed and ``path`` is untouched."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())  # mkstemp's 0600 is no mode danka's files have
    finally:
        os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, new_file_mode())  # also where the writer replaced the temp file
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str, *, sync_dir: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path, sync_dir=sync_dir) as tmp:
        tmp.write_text(text, encoding="utf-8")


def read_json_lines(path: Path, *, what: str = "the file", fix: str = "") -> list[dict[str, Any]]:
    """The readable JSON objects of a jsonl file a run writes (metrics, completions), in
    file order; [] when it does not exist. A live run's half-written last line, a broken
    line, a line nested too deep or over 16 MiB, and a value that is not an object are
    skipped (readers of a run in progress). A path that exists but is no regular file (a
    named pipe, a folder, a symlink loop) is a UserError (danka.safe_read)."""
    from danka.safe_read import iter_json_lines

    if not os.path.lexists(path):
        return []
    return [v for _, v in iter_json_lines(path, what=what, fix=fix) if isinstance(v, dict)]


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file danka wrote (a marker, a checkpoint's training info), or None when
    it is missing, broken, not an object, or no regular file (never blocks on a pipe)."""
    from danka.errors import UserError
    from danka.safe_read import read_json

    try:
        value = read_json(path)
    except UserError:
        return None
    return value if isinstance(value, dict) else None


def prepare_output_file(path: str | Path, flag: str = "--output") -> Path:
    """``path`` ready to be written (its folder created), checked before any work starts:
    UserError when it is a folder, or its folder cannot be made (read-only, no permission,
    a file in the way)."""
    from danka.errors import UserError, output_dir_error

    path = Path(path)
    if path.is_dir():
        raise UserError(
            f"{flag} is a folder, not a file",
            where=str(path),
            fix=f"{flag} results/answers.jsonl (a file name)",
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise output_dir_error(path.parent, err, flag) from None
    return path
