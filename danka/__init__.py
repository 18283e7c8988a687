"""danka (单卡, "one card"): RL post-training for LLMs on one GPU or a CPU.

The Python API (each name is imported on first use, so ``import danka`` stays light)::

    import danka

    result = danka.train("examples/quickstart.yaml", overrides=["trainer.total_steps=2"])
    cfg = danka.Config.from_dict({"model": {...}, "trainer": {...}, "data": {...}})
    result = danka.train(cfg, callbacks=[MyCallback()])  # danka.Callback: on_step/eval/checkpoint
    danka.push(result.checkpoint, "me/my-model")          # a model card comes with it
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute); resolved by __getattr__ on first use
_LAZY = {
    "Config": ("danka.schema.sections", "DankaConfig"),
    "train": ("danka.api", "train"),
    "TrainResult": ("danka.api", "TrainResult"),
    "Callback": ("danka.callbacks", "Callback"),
    "push": ("danka.tools.hub", "push"),
    "export": ("danka.tools.export", "export_merged"),
    "UserError": ("danka.errors", "UserError"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'danka' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
