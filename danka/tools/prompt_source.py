"""Where ``danka generate`` and ``danka chat`` find the prompt format a model was trained
and scored with (danka.data.prompt_format), so that it answers as it was scored.

A checkpoint written by this danka keeps it in ``danka_training.json`` (``prompt_format``);
an older one has it in its run's config (``OUTPUT/state/checkpoint_N/config.json``, else
``OUTPUT/config.json``); a ``danka export`` folder in its own ``danka_training.json`` or
through ``exported_from``. A model danka did not train has none: its prompts go bare.
"""

from __future__ import annotations

from pathlib import Path

from danka.data.prompt_format import PromptFormat
from danka.errors import UserError
from danka.io import read_json_object
from danka.model_card import read_training_info

FLAG = "--no-prompt-format"


def _from_run_config(folder: Path) -> tuple[PromptFormat, Path] | None:
    """An ``OUTPUT/actor/checkpoint_N`` of an older danka: its run's saved config."""
    if folder.parent.name != "actor":
        return None
    run = folder.parent.parent
    for config in (run / "state" / folder.name / "config.json", run / "config.json"):
        data = read_json_object(config)
        if data is not None and isinstance(data.get("data"), dict):
            return PromptFormat.of(data["data"]), config
    return None


def find_prompt_format(path: str | Path | None, _hops: int = 2) -> tuple[PromptFormat, Path] | None:
    """``(format, the file it was read from)`` for a checkpoint, run or export folder
    (a run folder: its newest checkpoint); None when nothing says how it was trained."""
    from danka.tools.locate import resolve_checkpoint

    if not path or not Path(path).expanduser().is_dir():
        return None  # a hub id or a .gguf file: not trained by danka here
    try:
        folder = resolve_checkpoint(path).resolve()
    except UserError:
        return None
    info = read_training_info(folder) or {}
    if "prompt_format" in info:
        return PromptFormat.from_json(info["prompt_format"]), folder / "danka_training.json"
    found = _from_run_config(folder)
    if found is None and info.get("exported_from") and _hops:  # an export of an older checkpoint
        found = find_prompt_format(info["exported_from"], _hops - 1)
    return found


def prompt_format_for(
    model: str | None, adapter: str | None, *, apply: bool, system: str | None, log
) -> PromptFormat:
    """The format ``generate`` / ``chat`` put around each prompt, and one line saying so
    (``log``): the run's (``apply``) or none (``--no-prompt-format``). ``system`` (the
    ``--system`` flag) replaces the run's system prompt."""
    found = find_prompt_format(adapter or model)
    if found is None or not found[0]:
        return PromptFormat(system_prompt=system)
    fmt, where = found
    if not apply:
        log(f"prompt format: none ({FLAG}); the model was trained with {fmt.describe()} ({where})")
        return PromptFormat(system_prompt=system)
    log(
        f"prompt format: {fmt.describe()}, as in training and evaluation ({where}); "
        f"{FLAG} for the bare prompt"
    )
    return PromptFormat(system or fmt.system_prompt, fmt.instruction, fmt.examples)
