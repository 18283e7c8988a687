"""Crash-safe checkpoints and exact resume.

``store``: save / verify / find / load checkpoints (protocol in its docstring);
``retention``: keep_last, and what happens to newer or damaged checkpoints on resume;
``rng``: capture and restore every RNG; ``config_diff``: config hash and diff for resume.
"""

from danka.checkpoint.config_diff import config_hash, diff_configs
from danka.checkpoint.retention import delete_checkpoints_after, put_aside_after
from danka.checkpoint.rng import capture_rng_state, restore_rng_state
from danka.checkpoint.store import (
    Manifest,
    checkpoint_parts,
    complete_checkpoints,
    find_latest_checkpoint,
    load_checkpoint_config,
    load_trainer_state,
    save_checkpoint,
    verify_checkpoint,
)

__all__ = [
    "Manifest",
    "capture_rng_state",
    "checkpoint_parts",
    "complete_checkpoints",
    "delete_checkpoints_after",
    "config_hash",
    "diff_configs",
    "find_latest_checkpoint",
    "load_checkpoint_config",
    "load_trainer_state",
    "restore_rng_state",
    "put_aside_after",
    "save_checkpoint",
    "verify_checkpoint",
]
