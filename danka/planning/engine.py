"""Which rollout engine a run uses, and why (logged at start-up).

It sits above the rollout package: the choice asks the memory plan
(danka/planning/micro.py), which itself reads the engine's geometry.
"""

from __future__ import annotations

import torch

from danka.planning.inputs import PlanInput
from danka.planning.memory import GIB, price
from danka.planning.micro import plan_memory
from danka.planning.shape import ModelShape, load_model_config
from danka.rollout.base import resolve_engine


def choose_engine(
    cfg,
    device: torch.device,
    *,
    model_config=None,
    free_bytes: int | None = None,
    shape: ModelShape | None = None,
) -> tuple[str, str]:
    """``rollout.engine`` resolved to "hf" or "fast", with the reason to log.

    Order: an explicit ``rollout.engine`` (the tutorial's ``backend.hf_transformers.
    enable_hf_transformers: true`` is read as ``hf``); no CUDA device or a quantised base (HF); a model
    type the fast engine does not run (HF); else fast only when ``danka estimate``'s whole
    step with the fast engine fits the free GPU memory (``free_bytes``, default: now).
    ``shape``: the model's, when the caller read it already (else ``model_config``'s).
    """
    from danka.rollout.fast_weights import SUPPORTED_MODEL_TYPES

    r, m = cfg.rollout, cfg.model
    quantized = bool(m.load_in_4bit or m.load_in_8bit)
    if r.engine != "auto":
        return resolve_engine(r.engine, device.type, quantized=quantized), (
            f"rollout.engine: {r.engine}"
        )
    name = resolve_engine("auto", device.type, quantized=quantized)
    if name != "fast":
        why = "a quantised base" if quantized else f"device {device.type}"
        return name, f"rollout.engine: auto picks {name} for {why}"
    inp = PlanInput.of(cfg)
    if shape is None:
        config = model_config or load_model_config(m.actor_model_name_or_path)
        shape = ModelShape.of(config, inp.target_modules, inp.lora_r)
    if shape.model_type not in SUPPORTED_MODEL_TYPES:
        return "hf", f"the fast engine does not run model type {shape.model_type!r}"
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    need = {}
    for name in ("fast", "hf"):
        sizes = plan_memory(inp.with_(engine=name), shape, free_bytes).sizes  # auto sizes
        need[name] = price(sizes, shape).need
    text = f"{need['fast'] / GIB:.1f} GiB (HF {need['hf'] / GIB:.1f})"
    free = f"{free_bytes / GIB:.1f} GiB free"
    if need["fast"] <= free_bytes:
        return "fast", f"the whole step with the fast engine fits: {text} of {free}"
    return "hf", f"the fast engine's step would need {text}, more than {free}"
