"""Keys of the single-card tutorial's config that cannot work as written on this machine:
what danka does instead.

:func:`apply_fallbacks` runs once after validation. Each fallback changes the config to
what danka will actually do and returns ONE warning line saying so (the CLI logs it as
``[WARNING] ...`` into ``OUTPUT/logs/train.log``). Never a traceback:

- ``model.use_flash_attention_2: true`` without an importable ``flash_attn`` (or without a
  CUDA GPU, or with float32) -> ``attn_implementation: sdpa`` (PyTorch's fused attention);
- ``logging.wandb_project`` without the ``wandb`` package -> local logging only
  (train.log, metrics.jsonl, TensorBoard).
"""

from __future__ import annotations

import importlib
import importlib.util

from danka.schema.sections import DankaConfig

_WARNINGS_ATTR = "_danka_fallback_warnings"


def _flash_attn_problem(cfg: DankaConfig) -> str | None:
    """Why FlashAttention-2 cannot be used here (None if it can)."""
    if importlib.util.find_spec("flash_attn") is None:
        return "flash_attn is not installed (pip install danka[flash])"
    try:
        importlib.import_module("flash_attn")
    except Exception as err:  # noqa: BLE001 - a broken build raises anything
        return f"flash_attn does not import ({type(err).__name__}: {err})"
    import torch

    if cfg.model.device == "cpu" or not torch.cuda.is_available():
        return "FlashAttention-2 needs a CUDA GPU"
    if cfg.model.torch_dtype == "float32":
        return "FlashAttention-2 needs bfloat16 or float16"
    return None


def apply_fallbacks(cfg: DankaConfig) -> list[str]:
    """Change ``cfg`` in place to what danka does instead; return the warning lines (also
    kept on the config for :func:`fallback_warnings`)."""
    warnings: list[str] = []
    m = cfg.model
    if m.use_flash_attention_2:
        problem = _flash_attn_problem(cfg)
        if problem:
            m.use_flash_attention_2 = False
            m.attn_implementation = "sdpa"
            warnings.append(
                f"model.use_flash_attention_2: true, but {problem}; using sdpa attention "
                "instead (same results, more memory on long sequences)"
            )
    if cfg.logging.wandb_project and importlib.util.find_spec("wandb") is None:
        warnings.append(
            f"logging.wandb_project: {cfg.logging.wandb_project} is set, but wandb is not "
            "installed (pip install danka[wandb]); logging locally only (logs/train.log, "
            "metrics.jsonl, TensorBoard)"
        )
        cfg.logging.wandb_project = None
    setattr(cfg, _WARNINGS_ATTR, getattr(cfg, _WARNINGS_ATTR, []) + warnings)
    return warnings


def add_warning(cfg: DankaConfig, line: str) -> None:
    """One more start-up warning about ``cfg`` (validation's notes, e.g. a data source
    that replaced another), logged and printed with the fallbacks'."""
    setattr(cfg, _WARNINGS_ATTR, getattr(cfg, _WARNINGS_ATTR, []) + [line])


_NOTES_ATTR = "_danka_config_notes"


def add_note(cfg: DankaConfig, line: str) -> None:
    """A start-up note about ``cfg`` (an older key read as what it means now, moved.py),
    logged as ``[INFO]``."""
    setattr(cfg, _NOTES_ATTR, getattr(cfg, _NOTES_ATTR, []) + [line])


def config_notes(cfg: DankaConfig) -> list[str]:
    """The notes :func:`add_note` kept for this config."""
    return list(getattr(cfg, _NOTES_ATTR, []))


def fallback_warnings(cfg: DankaConfig) -> list[str]:
    """The warning lines :func:`apply_fallbacks` produced for this config."""
    return list(getattr(cfg, _WARNINGS_ATTR, []))
