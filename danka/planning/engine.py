"""Which rollout engine a run uses, and why (logged at start-up).

It sits above the rollout package: the choice asks the memory plan
(danka/planning/memory.py), which itself reads the engine registry.
"""

from __future__ import annotations

import copy

import torch

from danka.rollout.base import resolve_engine


def choose_engine(
    cfg, device: torch.device, *, model_config=None, free_bytes: int | None = None
) -> tuple[str, str]:
    """``rollout.engine`` resolved to "hf", "fast" or "vllm", with the reason to log.

    Order: an explicit ``rollout.engine``; the seed's ``backend.vllm.enable_vllm: true``
    (vLLM) and ``backend.hf_transformers.enable_hf_transformers: true`` (HF); no CUDA device
    or a quantised base (HF); a model type the fast engine does not run (HF); vLLM where
    ``danka.planning.vllm.VLLM_FASTER_AT`` says it is faster, it is installed and its step
    fits; else fast only when ``danka estimate``'s whole step with the fast engine fits the
    free GPU memory (``free_bytes``, default: now).
    """
    from danka.planning.memory import (
        GIB,
        OVERHEAD_BYTES,
        estimate_memory,
        load_model_config,
        samples_per_prompt_of,
    )
    from danka.planning.micro import with_planned
    from danka.planning.vllm import prefers_vllm
    from danka.rollout.fast_weights import SUPPORTED_MODEL_TYPES

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
    if cfg.backend.hf_transformers.enable_hf_transformers:
        return "hf", "backend.hf_transformers.enable_hf_transformers: true"
    name = resolve_engine("auto", device.type, quantized=quantized)
    if name != "fast":
        why = "a quantised base" if quantized else f"device {device.type}"
        return name, f"rollout.engine: auto picks {name} for {why}"
    config = model_config or load_model_config(m.actor_model_name_or_path)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return "hf", f"the fast engine does not run model type {config.model_type!r}"
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    step_seqs = cfg.trainer.batch_size * samples_per_prompt_of(cfg)
    faster = prefers_vllm(cfg, config.model_type, step_seqs)
    plans = {}
    for name in ("vllm", "fast", "hf") if faster else ("fast", "hf"):
        c = copy.deepcopy(cfg)
        c.rollout.engine = name
        c, _ = with_planned(c, free_bytes, model_config=config)  # micro_batch_size: auto
        plans[name] = estimate_memory(c, model_config=config)["peak"] + OVERHEAD_BYTES
    need = f"{plans['fast'] / GIB:.1f} GiB (HF {plans['hf'] / GIB:.1f})"
    free = f"{free_bytes / GIB:.1f} GiB free"
    if faster and plans["vllm"] <= free_bytes:
        return "vllm", f"{faster}; its step fits: {plans['vllm'] / GIB:.1f} GiB of {free}"
    if plans["fast"] <= free_bytes:
        return "fast", f"the whole step with the fast engine fits: {need} of {free}"
    return "hf", f"the fast engine's step would need {need}, more than {free}"
