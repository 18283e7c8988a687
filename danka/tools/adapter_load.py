"""A LoRA adapter put on its base for ``generate``, ``chat``, ``eval`` and ``export``: one
place, so that an adapter that does not fit the base is one message naming both.

peft reports a mismatch in its own words, as a traceback: ``NoMatchingPeftModuleError``
when ``target_modules`` names layers the base lacks, a ``RuntimeError`` listing every
"size mismatch" when the weights were trained on a model of another shape (an
``adapter_config.json`` naming the wrong base, or ``--model`` another one), a
``TypeError`` for a config this peft cannot read. :func:`attach_adapter` turns each into
a :class:`~danka.errors.UserError` (exit 2) with the adapter, the base loaded, the base
the adapter says it was trained on, and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from danka.errors import UserError, first_line
from danka.model_card import read_training_info
from danka.safe_read import read_json

_SHAPE = re.compile(
    r"size mismatch for (\S+): copying a param with shape (torch\.Size\(\[[^\]]*\]\)) from "
    r"checkpoint, the shape in current model is (torch\.Size\(\[[^\]]*\]\))"
)


def _trained_on(adapter: Path) -> str | None:
    """The base the adapter names: danka's training record, else adapter_config.json."""
    info = read_training_info(adapter) or {}
    if info.get("base_model"):
        return str(info["base_model"])
    try:
        config = read_json(adapter / "adapter_config.json")
    except UserError:
        return None
    return config.get("base_model_name_or_path") if isinstance(config, dict) else None


def _mismatch(err: BaseException, adapter: Path, base_name: str) -> UserError | None:
    """``err`` from ``PeftModel.from_pretrained`` as a UserError, or None (not a mismatch)."""
    text = str(err)
    trained = _trained_on(adapter)
    bases = f"the base model loaded is {base_name}" + (
        f"; the adapter names {trained} as its base" if trained and trained != base_name else ""
    )
    fix = (
        "load it on the base it was trained on: pass --model with that base (a run's "
        "danka_training.json and model card name it), or fix base_model_name_or_path in "
        "adapter_config.json"
    )
    if type(err).__name__ == "NoMatchingPeftModuleError" or "not found in the base model" in text:
        return UserError(
            f"the adapter's target_modules name layers the base model does not have "
            f"({first_line(err)}); {bases}",
            where=str(adapter / "adapter_config.json"),
            fix=fix,
        )
    if isinstance(err, RuntimeError) and "size mismatch" in text:
        m = _SHAPE.search(text)
        shapes = (
            f": {m.group(1).split('base_model.model.')[-1]} is {m.group(2)[11:-1]} in the "
            f"adapter, {m.group(3)[11:-1]} in the model"
            if m
            else ""
        )
        return UserError(
            f"the adapter was trained on a model of another shape{shapes}; {bases}",
            where=str(adapter),
            fix=fix,
        )
    if isinstance(err, (TypeError, ValueError, KeyError)):
        return UserError(
            f"peft cannot read this adapter ({type(err).__name__}: {first_line(err)[:200]})",
            where=str(adapter / "adapter_config.json"),
            fix="re-save the adapter with peft (danka train writes one), or use the peft "
            "version it was saved with",
        )
    return None


def attach_adapter(base: Any, adapter: str | Path, *, base_name: str) -> Any:
    """``PeftModel.from_pretrained(base, adapter)`` (not merged); UserError when the adapter
    does not fit ``base`` (named ``base_name`` in the message)."""
    from peft import PeftModel

    adapter = Path(adapter)
    try:
        return PeftModel.from_pretrained(base, str(adapter))
    except Exception as err:  # noqa: BLE001 - peft's mismatch errors, else re-raised
        user = _mismatch(err, adapter, base_name)
        if user is None:
            raise
        raise user from None
