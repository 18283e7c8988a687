"""The vLLM engine in the memory plan and in ``rollout.engine: auto``.

* the memory plan (danka.planning.memory) adds the GPU share a colocated vLLM holds all run
  (danka.rollout.vllm.memory's formula at the plan's sizes) to every phase;
* ``engine_memory``: that share as vLLM's ``gpu_memory_utilization`` for this card, with
  ``max_model_len``, handed to the engine at start-up (``EngineOptions``);
* ``VLLM_FASTER_AT`` / ``prefers_vllm``: where ``auto`` picks vLLM over the fast engine when
  it is installed. Empty until a benchmark on the GPU shows vLLM ahead at a shape
  (``python -m bench vllm``, BENCHMARKS.md); each row says where it was measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from danka.planning.inputs import PlanInput
from danka.planning.shape import ModelShape
from danka.schema.sections import DankaConfig


def engine_memory(
    cfg: DankaConfig, sizes: PlanInput, shape: ModelShape, device: torch.device
) -> dict[str, Any]:
    """``EngineOptions`` fields of an engine with its own memory: ``gpu_memory_fraction``
    (the plan's vLLM share over the card's memory) and ``max_model_len`` (the longest
    request: ``trainer.max_length``, or a prompt plus evaluation's new tokens if more; the
    KV cache is sized by the plan's sequences, not by this); ``sizes``: the run's sizes
    with ``auto`` resolved (danka.planning.micro), ``shape``: the actor's."""
    from danka.planning.memory import price

    plan = price(sizes.with_(engine="vllm"), shape)
    share = plan.vllm_share
    assert share is not None  # price() of a vllm input always holds its share
    total = torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else share.total * 2
    # the longest request: a multi-turn sample grows to max_length, an evaluation answer
    # may be longer than a training one
    a = plan.assumptions
    longest = max(
        cfg.trainer.max_length, a.sequence_tokens, a.prompt_tokens + (cfg.eval.max_new_tokens or 0)
    )
    return {"gpu_memory_fraction": share.fraction(total), "max_model_len": longest}


@dataclass(frozen=True)
class FasterAt:
    """A shape at which a benchmark measured vLLM faster than the fast engine."""

    model_types: tuple[str, ...]  # e.g. ("qwen2",)
    min_sequences: int  # sequences per step (batch_size x samples_per_prompt)
    min_new_tokens: int
    lora: bool | None  # None: either
    measured: str  # the result file and GPU it comes from


# Filled from bench/results once the GPU benchmark has run; empty: auto never picks vLLM.
VLLM_FASTER_AT: tuple[FasterAt, ...] = ()


def vllm_installed() -> bool:
    """vLLM is installed for this torch (its start-up check passes on a GPU)."""
    from danka.errors import UserError
    from danka.rollout.vllm.calls import check_vllm

    try:
        check_vllm("cuda")
    except UserError:
        return False
    return True


def prefers_vllm(cfg: DankaConfig, model_type: str | None, sequences: int) -> str | None:
    """The reason ``auto`` picks vLLM for this run (a ``VLLM_FASTER_AT`` row matches and
    vLLM is installed), else None."""
    t = cfg.trainer
    for row in VLLM_FASTER_AT:
        if (
            model_type in row.model_types
            and sequences >= row.min_sequences
            and t.max_new_tokens >= row.min_new_tokens
            and row.lora in (None, cfg.lora.enable_lora)
            and vllm_installed()
        ):
            return f"vLLM is faster at this shape ({row.measured})"
    return None
