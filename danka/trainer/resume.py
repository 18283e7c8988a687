"""Which checkpoint a run continues from (``--resume``), and putting the run back there."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from danka.checkpoint import complete_checkpoints, put_aside_after, verify_checkpoint
from danka.checkpoint.store import latest_verified
from danka.errors import UserError
from danka.trainer.history import RunHistory
from danka.trainer.saving import Checkpointer


def resolve_resume(resume: str | None, output_dir: Path, log: logging.Logger) -> Path | None:
    """The state dir to resume from. ``auto`` with nothing complete to resume is not an
    error (a job script can always pass it): the run starts at step 0 and says so."""
    if resume is None:
        done = complete_checkpoints(output_dir)
        if done:  # why: a fresh run would mix its checkpoints with these (and truncate metrics)
            raise UserError(
                f"output_dir already holds checkpoints of an earlier run (newest: {done[0]})",
                where=str(output_dir),
                fix="continue that run with --resume auto, or set output_dir to a new folder "
                "(or delete this one)",
            )
        return None
    if resume == "auto":
        found, skipped = latest_verified(output_dir)
        if skipped and os.environ.get("RANK", "0") == "0":  # one process renames
            # training on would write these step numbers again: move them out of the way
            # (reported, never deleted) before anything else happens
            start = int(found.name.split("_")[1]) if found is not None else 0
            for line in put_aside_after(output_dir, start, why=skipped):
                log.warning(f"--resume auto: {line}")
        if found is None:
            log.info(f"--resume auto: no complete checkpoint in {output_dir}, starting from step 0")
        return found
    path = Path(resume)
    if not path.exists():
        raise UserError(
            "checkpoint not found",
            where=str(path),
            fix="give OUTPUT/state/checkpoint_N or use --resume auto",
        )
    if path.parent.name in ("actor", "critic"):  # accept OUTPUT/actor/checkpoint_N too
        path = path.parent.parent / "state" / path.name
    if not path.name.startswith("checkpoint_") or not path.is_dir():
        raise UserError(
            "not a checkpoint folder",
            where=str(path),
            fix="give OUTPUT/state/checkpoint_N (or OUTPUT/actor/checkpoint_N), "
            "or use --resume auto to take the newest complete one",
        )
    verify_checkpoint(path)
    return path


def resume_from(
    checkpointer: Checkpointer, ckpt: Path | None, resolved: dict, main: bool
) -> tuple[int, RunHistory]:
    """(step, history) to continue from: (0, no evaluations) for a fresh run."""
    if ckpt is None:
        return 0, RunHistory()
    log = checkpointer.log
    start, history = checkpointer.restore(ckpt, resolved)
    log.info(f"Resumed from {ckpt} at step {start}")
    if main:
        # newer checkpoints belong to the abandoned continuation (its metrics lines go
        # too); left in place, a later --resume auto would jump back onto them. They are
        # set aside, not deleted (`danka train --discard-newer` deletes them first)
        for line in put_aside_after(checkpointer.output_dir, start):
            log.warning(line)
    return start, RunHistory.from_json(history)
