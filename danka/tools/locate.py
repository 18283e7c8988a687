"""Where a trained model is: a checkpoint folder, or a run's newest one.

Tools accept either ``OUTPUT/actor/checkpoint_N`` (a LoRA adapter or a full model) or the
run folder ``OUTPUT`` (or ``OUTPUT/actor``), which means its newest complete checkpoint:
the highest ``N`` whose ``state/checkpoint_N/manifest.json`` exists (the manifest is
written last, so its presence means every part was renamed into place).
"""

from __future__ import annotations

import re
from pathlib import Path

from danka.errors import UserError
from danka.io import read_json_object

_CKPT = re.compile(r"^checkpoint_(\d+)$")


def is_adapter(folder: Path) -> bool:
    return (Path(folder) / "adapter_config.json").is_file()


def is_model(folder: Path) -> bool:
    """A Hugging Face model folder: its ``config.json`` names a ``model_type`` (a run
    folder's ``config.json`` is danka's resolved config, which has none)."""
    config = read_json_object(Path(folder) / "config.json")
    return config is not None and "model_type" in config and not is_adapter(folder)


def latest_actor_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete ``actor/checkpoint_N`` of a run folder, or None."""
    run_dir = Path(run_dir)
    actor = run_dir / "actor"
    if not actor.is_dir():
        return None
    found = []
    for folder in actor.iterdir():
        m = _CKPT.match(folder.name)
        if m and folder.is_dir():
            if (run_dir / "state" / folder.name / "manifest.json").is_file():
                found.append((int(m.group(1)), folder))
    return max(found)[1] if found else None


def resolve_checkpoint(path: str | Path, *, flag: str = "--adapter") -> Path:
    """``path`` itself when it is an adapter or model folder; for a run folder (or its
    ``actor/``), the newest complete checkpoint. UserError when there is none."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"{flag.lstrip('-')} folder not found: {folder}",
            where=flag,
            fix="give OUTPUT/actor/checkpoint_N or a run's output folder",
        )
    if is_adapter(folder) or is_model(folder):
        return folder
    run_dir = folder.parent if folder.name == "actor" else folder
    latest = latest_actor_checkpoint(run_dir)
    if latest is None:
        raise UserError(
            f"{folder} is neither a checkpoint nor a run folder with a complete checkpoint",
            where=flag,
            fix="give OUTPUT/actor/checkpoint_N, or the output_dir of a danka train run "
            "that saved one",
        )
    return latest
