"""Save, verify, find and load checkpoints.

Layout under the run's output dir (one folder per part, one ``checkpoint_<step>`` each)::

    OUTPUT/actor/checkpoint_<step>/    PEFT adapter or full weights (safetensors)
    OUTPUT/critic/checkpoint_<step>/   critic adapter + value head (PPO only)
    OUTPUT/state/checkpoint_<step>/    trainer_state.pt, config.json, manifest.json

Protocol of :func:`save_checkpoint` (why: a SIGKILL or power cut at any instant must leave
the previous checkpoint usable and the new one either complete or visibly incomplete):

1. every part is written into ``<part>/.tmp-checkpoint_<step>-<random>``, every file fsynced;
2. each temporary folder is renamed to ``<part>/checkpoint_<step>`` (rename is atomic);
3. LAST, ``state/checkpoint_<step>/manifest.json`` (sha256 + size of every file of every
   part) is written atomically. A checkpoint is complete iff its manifest exists and every
   hash matches, so a crash before step 3 leaves a checkpoint that resume ignores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from danka import __version__
from danka.errors import UserError
from danka.io import fsync_dir, write_text_atomic

log = logging.getLogger("danka.checkpoint")

STATE_PART = "state"
MANIFEST_NAME = "manifest.json"
TRAINER_STATE_NAME = "trainer_state.pt"
CONFIG_NAME = "config.json"
_CKPT_RE = re.compile(r"^checkpoint_(\d+)$")
_RESUME_FIX = "resume from another checkpoint (--resume PATH) or use `--resume auto`"


@dataclass
class Manifest:
    """Contents of ``manifest.json``: what a complete checkpoint holds."""

    step: int
    config_hash: str
    parts: dict[
        str, dict[str, Any]
    ]  # part -> {"dir": rel. to output dir, "files": {rel: {sha256, size}}}
    danka_version: str
    time: str
    state_dir: Path  # absolute path of state/checkpoint_<step>


# ---------------------------------------------------------------- filesystem helpers


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _hash_tree(root: Path) -> dict[str, dict[str, Any]]:
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME:
            continue
        files[rel] = {"sha256": _sha256(path), "size": path.stat().st_size}
    return files


def _step_of(path: Path) -> int | None:
    m = _CKPT_RE.match(path.name)
    return int(m.group(1)) if m else None


def _state_dirs(output_dir: Path) -> list[Path]:
    """All ``state/checkpoint_<step>`` folders, newest step first."""
    root = Path(output_dir) / STATE_PART
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and _step_of(p) is not None]
    return sorted(dirs, key=lambda p: _step_of(p), reverse=True)


# ---------------------------------------------------------------- save


def save_checkpoint(
    output_dir: Path,
    step: int,
    writers: dict[str, Callable[[Path], None]],
    *,
    trainer_state: dict,
    config_hash: str,
    keep_last: int | None,
    config: dict | None = None,
) -> Path:
    """Write checkpoint ``step`` crash-safely and return its state dir.

    ``writers[part](folder)`` writes that part's files (e.g. ``model.save_pretrained``) into
    ``folder``; ``trainer_state`` (tensors, numbers, strings, lists, dicts only) goes to
    ``state/checkpoint_<step>/trainer_state.pt``; ``config`` (the resolved config) to
    ``config.json`` next to it. An older ``checkpoint_<step>`` (a crashed attempt) is
    replaced; ``keep_last=N`` then deletes complete checkpoints older than the newest N.
    """
    output_dir = Path(output_dir)
    if STATE_PART in writers:
        raise ValueError(f"writer name {STATE_PART!r} is reserved for the trainer state")
    name = f"checkpoint_{step}"
    suffix = secrets.token_hex(4)

    def write_state(folder: Path) -> None:
        torch.save(trainer_state, folder / TRAINER_STATE_NAME)
        if config is not None:
            (folder / CONFIG_NAME).write_text(
                json.dumps(config, indent=2, sort_keys=True, default=str), encoding="utf-8"
            )

    all_writers = {**writers, STATE_PART: write_state}
    # 1. write every part into its temporary folder and fsync it
    tmp_dirs: dict[str, Path] = {}
    try:
        for part, writer in all_writers.items():
            part_root = output_dir / part
            part_root.mkdir(parents=True, exist_ok=True)
            tmp = part_root / f".tmp-{name}-{suffix}"
            tmp.mkdir()
            tmp_dirs[part] = tmp
            writer(tmp)
            _fsync_tree(tmp)
    except BaseException:
        for tmp in tmp_dirs.values():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    parts = {
        part: {"dir": f"{part}/{name}", "files": _hash_tree(tmp)} for part, tmp in tmp_dirs.items()
    }

    # 2. an older attempt at this step loses its manifest first, so it is never "complete"
    #    while its parts are being swapped
    state_final = output_dir / STATE_PART / name
    old_manifest = state_final / MANIFEST_NAME
    if old_manifest.exists():
        old_manifest.unlink()
        fsync_dir(state_final)
    for part, tmp in tmp_dirs.items():
        final = output_dir / part / name
        if final.exists():
            trash = final.with_name(f".tmp-old-{name}-{suffix}")
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(final.parent)

    # 3. the manifest, last and atomically
    _write_manifest(state_final, step, config_hash, parts)
    log.info("Saved checkpoint %d to %s", step, state_final)

    _sweep_tmp(output_dir)  # leftovers of writes a crash interrupted
    if keep_last is not None:
        _prune(output_dir, keep_last, keep_step=step)
    return state_final


def _write_manifest(state_dir: Path, step: int, config_hash: str, parts: dict) -> None:
    manifest = {
        "step": step,
        "config_hash": config_hash,
        "parts": parts,
        "danka_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_text_atomic(state_dir / MANIFEST_NAME, json.dumps(manifest, indent=2), sync_dir=True)


def _delete_checkpoint(output_dir: Path, state_dir: Path) -> None:
    """Remove the manifest first (so a crash mid-delete leaves an incomplete checkpoint)."""
    name = state_dir.name
    parts = {STATE_PART}
    manifest = state_dir / MANIFEST_NAME
    if manifest.exists():
        try:
            parts |= set(json.loads(manifest.read_text(encoding="utf-8"))["parts"])
        except (ValueError, KeyError):
            pass
        manifest.unlink()
        fsync_dir(state_dir)
    for part in sorted(parts - {STATE_PART}) + [STATE_PART]:
        shutil.rmtree(output_dir / part / name, ignore_errors=True)


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """State dirs whose manifest was written (the commit marker), newest first. Hashes are
    not checked here: ``verify_checkpoint`` does that."""
    return [d for d in _state_dirs(output_dir) if (d / MANIFEST_NAME).exists()]


def delete_checkpoints_after(output_dir: Path, step: int) -> list[str]:
    """Delete every checkpoint newer than ``step`` (manifest first); returns their names."""
    newer = [d for d in _state_dirs(output_dir) if _step_of(d) > step]
    for d in newer:
        _delete_checkpoint(output_dir, d)
    return [d.name for d in newer]


def _sweep_tmp(output_dir: Path) -> None:
    for part_root in Path(output_dir).iterdir():
        if part_root.is_dir():
            for pattern in (".tmp-checkpoint_*", ".tmp-old-checkpoint_*"):
                for stale in part_root.glob(pattern):
                    shutil.rmtree(stale, ignore_errors=True)


def _prune(output_dir: Path, keep_last: int, keep_step: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints (always ``keep_step``); drop
    incomplete checkpoints and orphaned parts older than ``keep_step``."""
    complete = complete_checkpoints(output_dir)
    kept = 0
    for d in complete:  # newest first
        if _step_of(d) == keep_step or kept < max(keep_last, 1):
            kept += 1
            continue
        log.info("Deleting old checkpoint %s (keep_last=%d)", d.name, keep_last)
        _delete_checkpoint(output_dir, d)
    for d in _state_dirs(output_dir):
        if not (d / MANIFEST_NAME).exists() and _step_of(d) < keep_step:
            _delete_checkpoint(output_dir, d)
    for part_root in Path(output_dir).iterdir():
        if part_root.is_dir():
            for orphan in part_root.glob("checkpoint_*"):  # a part whose state was deleted
                step = _step_of(orphan)
                state = output_dir / STATE_PART / orphan.name
                if step is not None and step < keep_step and not state.exists():
                    shutil.rmtree(orphan, ignore_errors=True)


# ---------------------------------------------------------------- find / verify / load


def _read_manifest(state_dir: Path) -> Manifest:
    state_dir = Path(state_dir)
    path = state_dir / MANIFEST_NAME
    if not path.is_file():
        raise UserError(
            f"checkpoint {state_dir} is incomplete or corrupted (no {MANIFEST_NAME}: "
            "the save was interrupted)",
            where=str(state_dir),
            fix=_RESUME_FIX,
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return Manifest(
            step=int(raw["step"]),
            config_hash=str(raw["config_hash"]),
            parts=dict(raw["parts"]),
            danka_version=str(raw.get("danka_version", "?")),
            time=str(raw.get("time", "?")),
            state_dir=state_dir.resolve(),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(
            f"checkpoint {state_dir} is incomplete or corrupted ({MANIFEST_NAME} unreadable: {err})",
            where=str(path),
            fix=_RESUME_FIX,
        ) from err


def verify_checkpoint(state_dir: Path) -> Manifest:
    """Check size and sha256 of every file of every part; UserError on the first mismatch."""
    manifest = _read_manifest(state_dir)
    output_dir = manifest.state_dir.parent.parent
    for info in manifest.parts.values():
        root = output_dir / info["dir"]
        for rel, meta in info["files"].items():
            path = root / rel

            def bad(detail: str, path: Path = path) -> UserError:
                return UserError(
                    f"checkpoint {manifest.state_dir} is incomplete or corrupted "
                    f"(file {path}: {detail})",
                    where=str(path),
                    fix=_RESUME_FIX,
                )

            if not path.is_file():
                raise bad("missing")
            size = path.stat().st_size
            if size != meta["size"]:
                raise bad(f"expected {meta['size']} bytes, found {size}")
            digest = _sha256(path)
            if digest != meta["sha256"]:
                raise bad(f"expected sha256 {meta['sha256']}, found {digest}")
    return manifest


def find_latest_checkpoint(output_dir: Path) -> Path | None:
    """State dir of the newest complete checkpoint under ``output_dir`` (None if there is
    none); newer incomplete or corrupted ones are skipped with a warning."""
    for state_dir in _state_dirs(Path(output_dir)):
        try:
            verify_checkpoint(state_dir)
        except UserError as err:
            log.warning("Ignoring %s: %s", state_dir, err.what)
            continue
        return state_dir
    return None


def checkpoint_parts(state_dir: Path) -> dict[str, Path]:
    """Part name -> absolute folder (``{"actor": .../actor/checkpoint_5, "state": ...}``)."""
    manifest = _read_manifest(state_dir)
    output_dir = manifest.state_dir.parent.parent
    return {part: output_dir / info["dir"] for part, info in manifest.parts.items()}


def load_trainer_state(state_dir: Path) -> dict:
    """The ``trainer_state`` dict, loaded with ``weights_only=True`` (never runs pickled code)."""
    path = Path(state_dir) / TRAINER_STATE_NAME
    if not path.is_file():
        raise UserError(
            f"no {TRAINER_STATE_NAME} in checkpoint", where=str(state_dir), fix=_RESUME_FIX
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def load_checkpoint_config(state_dir: Path) -> dict | None:
    """The resolved config saved with the checkpoint (None if it was saved without one)."""
    path = Path(state_dir) / CONFIG_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
