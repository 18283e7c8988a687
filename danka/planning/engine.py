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
    prompt_tokens: int | None = None,
) -> tuple[str, str]:
    """``rollout.engine`` resolved to "hf", "fast" or "vllm", with the reason to log.

    Order: an explicit ``rollout.engine`` (the tutorial's ``backend.hf_transformers.
    enable_hf_transformers: true`` is read as ``hf``); ``backend.vllm.enable_vllm: true``
    (vLLM); no CUDA device or a quantised base (HF); a model type the fast engine does not
    run (HF); vLLM where ``danka.planning.vllm.VLLM_FASTER_AT`` says it is faster, it is
    installed and its step fits; else fast only when ``danka estimate``'s whole step with
    the fast engine fits the free GPU memory (``free_bytes``, default: now).
    ``shape``: the model's, when the caller read it already (else ``model_config``'s);
    ``prompt_tokens``: the longest training prompt, when the data has been read.
    """
    from danka.planning.vllm import prefers_vllm
    from danka.rollout.fast.weights import SUPPORTED_MODEL_TYPES

    r, m = cfg.rollout, cfg.model
    quantized = bool(m.load_in_4bit or m.load_in_8bit)
    if r.engine != "auto":
        return resolve_engine(r.engine, device.type, quantized=quantized), (
            f"rollout.engine: {r.engine}"
        )
    if cfg.backend.vllm.enable_vllm:
        return resolve_engine("vllm", device.type, quantized=quantized), (
            "backend.vllm.enable_vllm: true"
        )
    name = resolve_engine("auto", device.type, quantized=quantized)
    if name != "fast":
        why = "a quantised base" if quantized else f"device {device.type}"
        return name, f"rollout.engine: auto picks {name} for {why}"
    inp = PlanInput.of(cfg, prompt_tokens)
    if shape is None:
        config = model_config or load_model_config(m.actor_model_name_or_path)
        shape = ModelShape.of(config, inp.target_modules, inp.lora_r)
    if shape.model_type not in SUPPORTED_MODEL_TYPES:
        return "hf", f"the fast engine does not run model type {shape.model_type!r}"
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    faster = prefers_vllm(cfg, shape.model_type, inp.batch_size * inp.samples_per_prompt)
    need = {}
    for name in ("vllm", "fast", "hf") if faster else ("fast", "hf"):
        sizes = plan_memory(inp.with_(engine=name), shape, free_bytes).sizes  # auto sizes
        need[name] = price(sizes, shape).need
    text = f"{need['fast'] / GIB:.1f} GiB (HF {need['hf'] / GIB:.1f})"
    free = f"{free_bytes / GIB:.1f} GiB free"
    if faster and need["vllm"] <= free_bytes:
        return "vllm", f"{faster}; its step fits: {need['vllm'] / GIB:.1f} GiB of {free}"
    if need["fast"] <= free_bytes:
        return "fast", f"the whole step with the fast engine fits: {text} of {free}"
    return "hf", f"the fast engine's step would need {text}, more than {free}"
