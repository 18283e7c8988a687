"""Which checkpoints stay when a run resumes, and what happens to damaged ones.

Rules (why: a checkpoint is the user's work; a wrong deletion cannot be undone):

* On resume, a newer checkpoint whose manifest exists but which fails verification (a
  metadata edit, a damaged file) is SET ASIDE: its folders are renamed to
  ``<part>/checkpoint_N.unverified-<time>`` (no longer a checkpoint name: nothing reads,
  prunes or overwrites it) and the rename is reported. Only leftovers of an interrupted
  save (no manifest: never a checkpoint) are deleted, and newer intact checkpoints only
  on an explicit ``--discard-newer`` (:func:`delete_checkpoints_after`).
* ``keep_last`` (store.prune) keeps the newest N checkpoints that verify and never
  deletes one that fails (it is reported, not counted): damaged checkpoints cannot push
  out the one a resume started from.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from danka.checkpoint.store import (
    _VERIFIED,
    MANIFEST_NAME,
    STATE_PART,
    _delete_checkpoint,
    _own_parts,
    _state_dirs,
    _step_of,
    verified,
)
from danka.io import fsync_dir

log = logging.getLogger("danka.checkpoint")

UNVERIFIED = ".unverified-"  # checkpoint_N.unverified-<time>: a set-aside checkpoint

# ---------------------------------------------------------------- folders of a checkpoint


def set_aside(output_dir: Path, state_dir: Path) -> list[Path]:
    """Rename every folder of checkpoint ``state_dir`` (all parts: the state folder last)
    to ``checkpoint_N.unverified-<time>``; returns the new paths. Nothing is deleted."""
    output_dir, name = Path(output_dir), Path(state_dir).name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    parts = sorted(p.name for p in output_dir.iterdir() if (p / name).is_dir())
    moved = []
    for part in sorted(set(parts) - {STATE_PART}) + ([STATE_PART] if STATE_PART in parts else []):
        src = output_dir / part / name
        dst, k = src.with_name(f"{name}{UNVERIFIED}{stamp}"), 2
        while dst.exists():
            dst, k = src.with_name(f"{name}{UNVERIFIED}{stamp}-{k}"), k + 1
        os.replace(src, dst)
        fsync_dir(dst.parent)
        moved.append(dst)
    _VERIFIED.pop(str(Path(state_dir).resolve()), None)
    return moved


# ---------------------------------------------------------------- resume


def newer_checkpoints(output_dir: Path, step: int) -> list[str]:
    """Names of danka's checkpoints newer than ``step`` (complete or not), oldest first."""
    newer = [d for d in _state_dirs(output_dir) if _step_of(d) > step]
    return [d.name for d in reversed(newer) if _own_parts(d) is not None]


def delete_checkpoints_after(output_dir: Path, step: int) -> list[str]:
    """Delete every danka checkpoint newer than ``step`` (manifest first); returns their
    names. Only for an explicit ``--discard-newer``: :func:`put_aside_after` otherwise."""
    newer = [d for d in _state_dirs(output_dir) if _step_of(d) > step]
    return [d.name for d in newer if _delete_checkpoint(output_dir, d)]


def put_aside_after(output_dir: Path, step: int, why: dict[str, str] | None = None) -> list[str]:
    """Clear the way for training on from ``step``: every danka checkpoint newer than it
    with a manifest is set aside (:func:`set_aside`), a leftover of an interrupted save
    (no manifest) is deleted. Returns one line per folder for the log. ``why``: name ->
    the verification failure, where known (it goes into the line)."""
    lines = []
    for d in [d for d in _state_dirs(output_dir) if _step_of(d) > step]:
        if not (d / MANIFEST_NAME).exists():
            if _delete_checkpoint(output_dir, d):
                lines.append(f"removed {d.name}: an interrupted save (it has no {MANIFEST_NAME})")
            continue
        moved = set_aside(output_dir, d)
        reason = (why or {}).get(d.name) or verified(d)[1] or f"newer than step {step}"
        shown = ", ".join(str(p.relative_to(output_dir)) for p in moved)
        lines.append(f"set aside {d.name} ({reason}): moved to {shown}, nothing deleted")
    return lines
