"""Where ``danka export`` may write, and writing there all at once.

``--output`` must be a folder that holds nothing danka keeps: not the checkpoint being
exported (``--adapter CK --output CK --overwrite`` wrote the merged model into the
checkpoint, which then failed its manifest, and ``--resume auto`` set it aside), not a
folder that holds it or lies inside it, not a run folder or any run's checkpoint, not a
file. :func:`check_output` refuses each with one message, before any model loads.

:func:`staged_folder` writes the export into a temporary folder beside ``--output`` and
renames it into place when everything is written: an export stopped by an error, a
signal or a full disk leaves the old folder (or none), never half of a model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from danka.errors import UserError, output_dir_error
from danka.io import apply_file_mode, temp_folder

_FIX = "choose a new --output folder, e.g. ./exported/my_model"


def _is_run_part(folder: Path) -> str | None:
    """What danka keeps in ``folder`` ("a run folder", "a checkpoint"), or None."""
    if any((folder / name).exists() for name in ("metrics.jsonl", ".danka.lock", "state")):
        return "a danka run folder"
    if folder.parent.name in ("actor", "critic", "state") and folder.name.startswith("checkpoint_"):
        return "a checkpoint of a danka run"
    return None


def check_output(output: Path, source: Path, *, overwrite: bool) -> None:
    """UserError unless the export may write ``output`` (see the module docstring)."""
    if output.exists() and not output.is_dir():
        raise UserError("--output is a file, not a folder", where=str(output), fix=_FIX)
    out, src = output.resolve(), Path(source).resolve()
    if out == src or src in out.parents or out in src.parents:
        what = "is" if out == src else ("is inside" if src in out.parents else "holds")
        raise UserError(
            f"--output {what} the checkpoint being exported ({src}): the merged model would "
            "overwrite it (and --resume would then set it aside as damaged)",
            where=str(output),
            fix=_FIX,
        )
    kept = _is_run_part(out) if out.is_dir() else None
    if kept:
        raise UserError(
            f"--output is {kept}; an export never writes into one, --overwrite or not",
            where=str(output),
            fix=_FIX,
        )
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(
            "output folder exists and is not empty",
            where=str(output),
            fix="choose a new --output folder (or pass --overwrite)",
        )


@contextlib.contextmanager
def staged_folder(output: Path) -> Iterator[Path]:
    """Yields an empty temporary folder beside ``output``; write the export there. On
    success it replaces ``output`` (an existing one is removed only then); on any error
    or signal it is removed and ``output`` is untouched."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_folder(output.parent, f".tmp-export-{output.name}-")
    except OSError as err:  # read-only filesystem, no permission, a file in the way
        raise output_dir_error(output, err, "--output") from None
    try:
        yield tmp
        apply_file_mode(tmp)  # danka's one file mode (safetensors makes 0600 files)
        old = None
        if output.exists():
            old = output.with_name(f".old-export-{output.name}-{os.getpid()}")
            os.rename(output, old)
        try:
            os.rename(tmp, output)
        except BaseException:
            if old is not None:
                os.rename(old, output)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
