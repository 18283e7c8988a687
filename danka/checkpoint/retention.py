"""Which checkpoints stay: ``keep_last``, newer checkpoints on resume, damaged ones.

Rules (why: a checkpoint is the user's work; a wrong deletion cannot be undone):

* ``keep_last=N`` keeps the newest N checkpoints that VERIFY (every file's size and sha256
  as the manifest says), always the one just saved, and never the one this run resumed
  from (:func:`protect`). A checkpoint that fails verification is neither counted nor
  deleted: it is reported and left in place.
* On resume, a newer checkpoint whose manifest exists but which fails verification (a
  metadata edit, a damaged file) is SET ASIDE: its folders are renamed to
  ``<part>/checkpoint_N.unverified-<time>`` (no longer a checkpoint name: nothing reads,
  prunes or overwrites it) and the rename is reported. Only leftovers of an interrupted
  save (no manifest: never a checkpoint) are deleted, and newer intact checkpoints only
  on an explicit ``--discard-newer``.

Verification reads every byte, so its result is remembered per checkpoint together with
the size and mtime of each file (a later ``keep_last`` pass re-hashes only a file that
changed since).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

from danka.checkpoint.store import (
    MANIFEST_NAME,
    PARTS_NAME,
    STATE_PART,
    _read_manifest,
    _safe_name,
    _state_dirs,
    _step_of,
    complete_checkpoints,
    verify_checkpoint,
)
from danka.errors import UserError
from danka.io import fsync_dir

log = logging.getLogger("danka.checkpoint")

UNVERIFIED = ".unverified-"  # checkpoint_N.unverified-<time>: a set-aside checkpoint

_VERIFIED: dict[str, tuple] = {}  # state dir -> file signature when it last verified
_PROTECTED: dict[str, set[int]] = {}  # output dir -> steps keep_last must not delete


# ---------------------------------------------------------------- verification, cached


def _signature(state_dir: Path) -> tuple | None:
    """(path, size, mtime) of every file the manifest lists; None if one is missing."""
    try:
        manifest = _read_manifest(state_dir)
        out = []
        root = manifest.state_dir.parent.parent
        for info in manifest.parts.values():
            for rel in sorted(info["files"]):
                st = os.stat(root / info["dir"] / rel)
                out.append((f"{info['dir']}/{rel}", st.st_size, st.st_mtime_ns))
        st = os.stat(manifest.state_dir / MANIFEST_NAME)
        out.append((MANIFEST_NAME, st.st_size, st.st_mtime_ns))
        return tuple(out)
    except (UserError, OSError):
        return None


def remember_verified(state_dir: Path) -> None:
    """``state_dir`` was just written and hashed: record it as verified."""
    signature = _signature(state_dir)
    if signature is not None:
        _VERIFIED[str(Path(state_dir).resolve())] = signature


def verified(state_dir: Path) -> tuple[bool, str]:
    """(True, "") if the checkpoint verifies, else (False, why)."""
    key, signature = str(Path(state_dir).resolve()), _signature(state_dir)
    if signature is not None and _VERIFIED.get(key) == signature:
        return True, ""
    try:
        verify_checkpoint(state_dir)
    except UserError as err:
        _VERIFIED.pop(key, None)
        return False, err.what
    if signature is not None:
        _VERIFIED[key] = signature
    return True, ""


def protect(output_dir: Path, step: int) -> None:
    """``keep_last`` never deletes checkpoint ``step`` of ``output_dir`` in this process
    (the one a resume started from: the last state known good before this run)."""
    _PROTECTED.setdefault(str(Path(output_dir).resolve()), set()).add(int(step))


# ---------------------------------------------------------------- folders of a checkpoint


def _own_parts(state_dir: Path) -> set[str] | None:
    """The part names danka wrote for this checkpoint (from its manifest, else from
    ``parts.json``); None if neither names them: then the folder is not danka's."""
    for reader in (
        lambda: set(_read_manifest(state_dir).parts),
        lambda: set(json.loads((state_dir / PARTS_NAME).read_text(encoding="utf-8"))),
    ):
        try:
            parts = reader()
        except (UserError, OSError, ValueError, TypeError):
            continue
        if all(isinstance(p, str) and _safe_name(p) for p in parts):
            return parts | {STATE_PART}
    return None


def _delete_checkpoint(output_dir: Path, state_dir: Path) -> bool:
    """Remove danka's checkpoint ``state_dir`` and its parts (manifest first, so a crash
    mid-delete leaves an incomplete checkpoint, state last). A folder danka did not write
    (no manifest, no parts.json) is left alone; returns whether it was deleted."""
    parts = _own_parts(state_dir)
    if parts is None:
        return False
    name = state_dir.name
    manifest = state_dir / MANIFEST_NAME
    if manifest.exists():
        manifest.unlink()
        fsync_dir(state_dir)
    for part in sorted(parts - {STATE_PART}) + [STATE_PART]:
        shutil.rmtree(output_dir / part / name, ignore_errors=True)
    fsync_dir(output_dir / STATE_PART)
    return True


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


# ---------------------------------------------------------------- resume and keep_last


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


def prune(output_dir: Path, keep_last: int, keep_step: int) -> None:
    """Keep the newest ``keep_last`` verified checkpoints (always ``keep_step``, never a
    protected one); a checkpoint that fails verification is reported and kept, uncounted.
    Danka's incomplete checkpoints older than ``keep_step`` go. Folders danka did not write
    (a ``checkpoint_<N>`` without manifest or parts.json) are never touched."""
    protected = _PROTECTED.get(str(Path(output_dir).resolve()), set())
    kept = 0
    for d in complete_checkpoints(output_dir):  # newest first
        step = _step_of(d)
        ok, why = verified(d)
        if not ok:
            log.warning("keep_last: %s fails verification (%s); kept, not counted", d.name, why)
            continue
        if step == keep_step or kept < max(keep_last, 1):
            kept += 1
            continue
        if step in protected:
            continue  # the resume started here
        if _delete_checkpoint(output_dir, d):
            _VERIFIED.pop(str(d.resolve()), None)
            log.info("Deleted old checkpoint %s (keep_last=%d)", d.name, keep_last)
    for d in _state_dirs(output_dir):
        if not (d / MANIFEST_NAME).exists() and _step_of(d) < keep_step:
            _delete_checkpoint(output_dir, d)
