"""Save, verify, find and load checkpoints.

Layout under the run's output dir (one folder per part, one ``checkpoint_<step>`` each)::

    OUTPUT/actor/checkpoint_<step>/    PEFT adapter or full weights (safetensors)
    OUTPUT/critic/checkpoint_<step>/   critic adapter + value head (PPO only)
    OUTPUT/state/checkpoint_<step>/    trainer_state.pt, config.json, manifest.json

Protocol of :func:`save_checkpoint` (why: a SIGKILL or power cut at any instant must leave
the previous checkpoint usable and the new one either complete or visibly incomplete):

1. every part is written into ``<part>/.tmp-checkpoint_<step>-<pid>-<random>``, every file
   fsynced (the pid: a later sweep of crash leftovers spares a live process's save);
2. each temporary folder is renamed to ``<part>/checkpoint_<step>`` (rename is atomic);
3. LAST, ``state/checkpoint_<step>/manifest.json`` (sha256 + size of every file of every
   part) is written atomically. A checkpoint is complete iff its manifest exists and every
   hash matches, so a crash before step 3 leaves a checkpoint that resume ignores.
"""

from __future__ import annotations

import errno
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
from danka.errors import DiskFull, UserError
from danka.io import apply_file_mode, fsync_dir, write_text_atomic
from danka.lifecycle import pid_alive
from danka.safe_read import read_json

log = logging.getLogger("danka.checkpoint")

STATE_PART = "state"
MANIFEST_NAME = "manifest.json"
TRAINER_STATE_NAME = "trainer_state.pt"
CONFIG_NAME = "config.json"
_CKPT_RE = re.compile(r"^checkpoint_(\d+)$")
_RESUME_FIX = "resume from another checkpoint (--resume PATH) or use `--resume auto`"
# the <pid>- part names the saving process; names without it (older danka) are always leftovers
_TMP_RE = re.compile(r"^\.tmp-(old-)?checkpoint_\d+-(?:(\d+)-)?[0-9a-f]{8}$")
PARTS_NAME = "parts.json"  # in state/checkpoint_<step>: the parts this save wrote (ours)


class CheckpointDiskFull(DiskFull):
    """The disk filled up while a checkpoint was written: a training fault (exit code 3);
    the temporary files are removed and the previous checkpoint is untouched."""


_FULL_BELOW = 1 << 20  # bytes free: a failed write with less than this left is a full disk


def _disk_full_error(err: BaseException, output_dir: Path) -> bool:
    """Did ``err`` come from a full disk? safetensors reports it as ``SafetensorError: ...
    No space left on device (os error 28)`` and torch.save as ``RuntimeError: [enforce
    fail at inline_container.cc] unexpected pos``, neither an OSError with ENOSPC; so
    the message is read, and a failed write with (almost) no space left counts too."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if any(m in str(err) for m in ("No space left on device", "os error 28", "Disk quota")):
        return True
    try:
        return shutil.disk_usage(output_dir).free < _FULL_BELOW
    except OSError:
        return False


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
    ``state/checkpoint_<step>/trainer_state.pt``; ``config`` (the resolved config, secrets
    masked) to ``config.json`` next to it. An older ``checkpoint_<step>`` (a crashed attempt)
    is replaced; ``keep_last=N`` then deletes danka's complete checkpoints older than the
    newest N. A full disk raises :class:`CheckpointDiskFull` (exit 3) with the space needed,
    after removing every temporary file.
    """
    output_dir = Path(output_dir)
    if STATE_PART in writers:
        raise ValueError(f"writer name {STATE_PART!r} is reserved for the trainer state")
    name = f"checkpoint_{step}"
    suffix = f"{os.getpid()}-{secrets.token_hex(4)}"
    write_state = _state_writer(trainer_state, config, sorted([*writers, STATE_PART]))
    all_writers = {**writers, STATE_PART: write_state}
    state_final = output_dir / STATE_PART / name
    tmp_dirs: dict[str, Path] = {}  # filled as each is made: a failure removes those made
    try:
        # 1. write every part into its temporary folder and fsync it
        _write_parts(output_dir, f".tmp-{name}-{suffix}", all_writers, tmp_dirs)
        parts = {
            part: {"dir": f"{part}/{name}", "files": _hash_tree(tmp)}
            for part, tmp in tmp_dirs.items()
        }
        # 2. swap each temporary folder in for the final name (rename is atomic)
        _swap_in(output_dir, name, suffix, tmp_dirs)
        # 3. the manifest, last and atomically
        _write_manifest(state_final, step, config_hash, parts)
    except Exception as err:
        full = _disk_full_error(err, output_dir)  # before the clean-up frees space again
        for tmp in tmp_dirs.values():
            shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise _disk_full(output_dir, step) from err
        raise
    except BaseException:
        for tmp in tmp_dirs.values():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = checkpoint_size(state_final)
    log.info("Saved checkpoint %d to %s (%s)", step, state_final, format_size(size))
    _retain(output_dir, state_final, step, keep_last)
    return state_final


def _state_writer(trainer_state: dict, config: dict | None, parts: list[str]):
    """The writer of the ``state`` part: trainer_state.pt, parts.json (``parts``: every
    part this save writes) and the masked config.json."""

    def write_state(folder: Path) -> None:
        torch.save(trainer_state, folder / TRAINER_STATE_NAME)
        (folder / PARTS_NAME).write_text(json.dumps(parts), encoding="utf-8")
        if config is not None:
            from danka.schema.secrets import mask_secrets

            (folder / CONFIG_NAME).write_text(
                json.dumps(mask_secrets(config), indent=2, sort_keys=True, default=str),
                encoding="utf-8",
            )

    return write_state


def _write_parts(
    output_dir: Path, tmp_name: str, writers: dict[str, Callable[[Path], None]], tmp_dirs: dict
) -> None:
    """Step 1: each part written into ``<part>/<tmp_name>`` and fsynced; each folder goes
    into ``tmp_dirs`` as soon as it exists (the caller removes them on failure)."""
    for part, writer in writers.items():
        part_root = output_dir / part
        if not part_root.is_dir():
            part_root.mkdir(parents=True, exist_ok=True)
            fsync_dir(output_dir)
        tmp = part_root / tmp_name
        tmp.mkdir()
        tmp_dirs[part] = tmp
        writer(tmp)
        apply_file_mode(tmp)  # the writers' own modes (safetensors: 0600) -> danka's
        _fsync_tree(tmp)


def _swap_in(output_dir: Path, name: str, suffix: str, tmp_dirs: dict[str, Path]) -> None:
    """Step 2: each temporary folder renamed to ``<part>/<name>``; an older folder of that
    name is first moved aside and deleted."""
    # an older attempt at this step loses its manifest first, so it is never
    # "complete" while its parts are being swapped
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
            fsync_dir(final.parent)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(final.parent)


def _retain(output_dir: Path, state_final: Path, step: int, keep_last: int | None) -> None:
    """After the commit: remember the new checkpoint as verified, sweep crash leftovers,
    apply ``keep_last``."""
    remember_verified(state_final)  # just hashed: keep_last need not read it again
    _sweep_tmp(output_dir)  # leftovers of writes a crash interrupted
    if keep_last is not None:
        prune(output_dir, keep_last, keep_step=step)


def format_size(n_bytes: int) -> str:
    """``1536`` -> ``"1.5 KB"`` (powers of 1024, like ``du -h``)."""
    size = float(n_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"  # pragma: no cover


def checkpoint_size(state_dir: Path) -> int:
    """Bytes of every file the manifest of ``state_dir`` lists (all parts): what ``du``
    would show for the checkpoint, e.g. ~150 MB for a 7B LoRA adapter."""
    manifest = _read_manifest(state_dir)
    return sum(meta["size"] for info in manifest.parts.values() for meta in info["files"].values())


def _disk_full(output_dir: Path, step: int) -> CheckpointDiskFull:
    """The message for a full disk: how much a checkpoint needs and how much is free."""
    done = complete_checkpoints(output_dir)
    need = 0
    if done:
        try:
            need = checkpoint_size(done[0])
        except UserError:
            need = 0
    free = shutil.disk_usage(output_dir).free
    needed = f"about {format_size(need)} free" if need else "more free space"
    return CheckpointDiskFull(
        f"no space left on the device while saving checkpoint {step}: a checkpoint needs "
        f"{needed}, {format_size(free)} is free; the partial save was removed",
        where=str(output_dir),
        fix="free disk space (or lower checkpoint.keep_last, or move output_dir), then "
        "continue with --resume auto",
    )


def _write_manifest(state_dir: Path, step: int, config_hash: str, parts: dict) -> None:
    manifest = {
        "step": step,
        "config_hash": config_hash,
        "parts": parts,
        "danka_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_text_atomic(state_dir / MANIFEST_NAME, json.dumps(manifest, indent=2), sync_dir=True)


def _safe_name(part: str) -> bool:
    return bool(part) and "/" not in part and "\\" not in part and part not in (".", "..")


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """State dirs whose manifest was written (the commit marker), newest first. Hashes are
    not checked here: ``verify_checkpoint`` does that."""
    return [d for d in _state_dirs(output_dir) if (d / MANIFEST_NAME).exists()]


def _sweep_tmp(output_dir: Path) -> None:
    """Remove temporary folders a crashed save left: only danka's exact temporary names
    (``.tmp-checkpoint_<N>-<pid>-<8 hex>``, ``.tmp-old-...``) one level below the output
    dir, and never one whose pid is another live process. Why: RunLock allows one run per
    dir, but a dir deleted under a live run and reused by a new one held two runs at once,
    and this sweep deleted the other run's save in progress (FileNotFoundError on its
    ``parts.json``); trainer.checkpointing now also stops a run that lost its lock."""
    for part_root in Path(output_dir).iterdir():
        if not part_root.is_dir():
            continue
        for stale in part_root.iterdir():
            m = _TMP_RE.match(stale.name)
            if not m or not stale.is_dir():
                continue
            pid = int(m.group(2)) if m.group(2) else None
            if pid is not None and pid != os.getpid() and pid_alive(pid):
                continue  # a save in progress in another process
            shutil.rmtree(stale, ignore_errors=True)


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
        raw = read_json(path, what=MANIFEST_NAME, fix=_RESUME_FIX)  # bounded, never a pipe
    except UserError as err:  # not JSON, nested too deep, not UTF-8, too large
        raise UserError(
            f"checkpoint {state_dir} is incomplete or corrupted ({MANIFEST_NAME} malformed: "
            f"{err.what})",
            where=str(path),
            fix=_RESUME_FIX,
        ) from None
    try:
        manifest = Manifest(
            step=int(raw["step"]),
            config_hash=str(raw["config_hash"]),
            parts=dict(raw["parts"]),
            danka_version=str(raw.get("danka_version", "?")),
            time=str(raw.get("time", "?")),
            state_dir=state_dir.resolve(),
        )
        _check_parts(manifest, state_dir.name)
        return manifest
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        detail = f"missing {err}" if isinstance(err, KeyError) else str(err)
        raise UserError(
            f"checkpoint {state_dir} is incomplete or corrupted ({MANIFEST_NAME} "
            f"malformed: {detail})",
            where=str(path),
            fix=_RESUME_FIX,
        ) from err


def _check_parts(manifest: Manifest, name: str) -> None:
    """ValueError unless every part is ``<part>/<name>`` and every file name is relative and
    stays inside its part (why: the manifest decides what resume reads and what pruning
    deletes; an absolute or ``..`` name would reach outside the output dir)."""
    if manifest.step != _step_of(Path(name)):
        raise ValueError(f"step {manifest.step} does not match the folder {name}")
    if STATE_PART not in manifest.parts:
        raise ValueError(f"no {STATE_PART!r} part")
    for part, info in manifest.parts.items():
        if not _safe_name(part):
            raise ValueError(f"part name {part!r} is not a plain folder name")
        if info["dir"] != f"{part}/{name}":
            raise ValueError(f"part {part!r} points to {info['dir']!r}, not {part}/{name}")
        files = info["files"]
        if not isinstance(files, dict):
            raise ValueError(f"part {part!r}: 'files' is not a mapping")
        for rel, meta in files.items():
            p = Path(rel)
            if p.is_absolute() or ".." in p.parts or not rel or rel.startswith(("/", "\\")):
                raise ValueError(f"part {part!r}: file name {rel!r} leaves the checkpoint")
            int(meta["size"]), str(meta["sha256"])


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


def latest_verified(output_dir: Path) -> tuple[Path | None, dict[str, str]]:
    """(state dir of the newest checkpoint that verifies or None, {name: why} of the newer
    ones that do not: incomplete, damaged or edited)."""
    skipped: dict[str, str] = {}
    for state_dir in _state_dirs(Path(output_dir)):
        try:
            verify_checkpoint(state_dir)
        except UserError as err:
            skipped[state_dir.name] = err.what
            continue
        return state_dir, skipped
    return None, skipped


def find_latest_checkpoint(output_dir: Path) -> Path | None:
    """State dir of the newest complete checkpoint under ``output_dir`` (None if there is
    none); newer incomplete or corrupted ones are skipped with a warning."""
    found, skipped = latest_verified(output_dir)
    for name, why in skipped.items():
        log.warning("Ignoring %s: %s", Path(output_dir) / STATE_PART / name, why)
    return found


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
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as err:
        kind = "a pickle that could run code" if "Weights only" in str(err) else "damaged"
        raise UserError(
            f"{TRAINER_STATE_NAME} is not plain tensors and numbers ({kind}): "
            "torch.load(weights_only=True) refused it, nothing in it was run",
            where=str(path),
            fix=_RESUME_FIX,
        ) from None


def load_checkpoint_config(state_dir: Path) -> dict | None:
    """The resolved config saved with the checkpoint (None if it was saved without one)."""
    path = Path(state_dir) / CONFIG_NAME
    if not path.exists() and not path.is_symlink():
        return None
    config = read_json(path, what=f"the checkpoint's {CONFIG_NAME}", fix=_RESUME_FIX)
    if not isinstance(config, dict):
        raise UserError(
            f"the checkpoint's {CONFIG_NAME} is not a JSON object", where=str(path), fix=_RESUME_FIX
        )
    return config


# ---------------------------------------------------------------- keep_last (verified only)
# Verification reads every byte, so its result is remembered per checkpoint with the size
# and mtime of each file: a later keep_last pass re-hashes only a file that changed since.

_VERIFIED: dict[str, tuple] = {}  # state dir -> file signature when it last verified


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


def _own_parts(state_dir: Path) -> set[str] | None:
    """The part names danka wrote for this checkpoint (from its manifest, else from
    ``parts.json``); None if neither names them: then the folder is not danka's."""
    for reader in (
        lambda: set(_read_manifest(state_dir).parts),
        lambda: set(read_json(state_dir / PARTS_NAME)),
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
    mid-delete leaves an incomplete checkpoint, state last). Each folder is first renamed
    to a ``.tmp-old-`` name and then deleted: a kill inside the delete leaves either the
    folder whole (its ``parts.json`` still names it danka's) or a temporary folder the
    next start sweeps, never a half-deleted ``checkpoint_<N>`` no pass could claim again.
    A folder danka did not write (no manifest, no parts.json) is left alone; returns
    whether it was deleted."""
    parts = _own_parts(state_dir)
    if parts is None:
        return False
    name = state_dir.name
    manifest = state_dir / MANIFEST_NAME
    if manifest.exists():
        manifest.unlink()
        fsync_dir(state_dir)
    suffix = f"{os.getpid()}-{secrets.token_hex(4)}"
    for part in sorted(parts - {STATE_PART}) + [STATE_PART]:
        folder = output_dir / part / name
        if not folder.is_dir():
            continue
        trash = folder.with_name(f".tmp-old-{name}-{suffix}")
        os.replace(folder, trash)
        fsync_dir(folder.parent)
        shutil.rmtree(trash, ignore_errors=True)
    return True


def prune(output_dir: Path, keep_last: int, keep_step: int) -> None:
    """Keep the newest ``keep_last`` checkpoints that verify (always ``keep_step``); one
    that fails verification is reported and kept, not counted, so damaged checkpoints
    never push out an intact one (the one a resume started from goes only once
    ``keep_last`` newer verified checkpoints exist). Danka's incomplete checkpoints older
    than ``keep_step`` go. Folders danka did not write (a ``checkpoint_<N>`` without
    manifest or parts.json) are never touched."""
    kept = 0
    for d in complete_checkpoints(output_dir):  # newest first
        ok, why = verified(d)
        if not ok:
            log.warning("keep_last: %s fails verification (%s); kept, not counted", d.name, why)
            continue
        if _step_of(d) == keep_step or kept < max(keep_last, 1):
            kept += 1
            continue
        if _delete_checkpoint(output_dir, d):
            _VERIFIED.pop(str(d.resolve()), None)
            log.info("Deleted old checkpoint %s (keep_last=%d)", d.name, keep_last)
    for d in _state_dirs(output_dir):
        if not (d / MANIFEST_NAME).exists() and _step_of(d) < keep_step:
            _delete_checkpoint(output_dir, d)
