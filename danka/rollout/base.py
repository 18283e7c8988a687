"""The rollout interface: prompts in, one ``RolloutBatch`` out.

Every engine samples ``n`` responses per prompt from the *live* policy (LoRA adapters
active, no merge and no weight copy) and returns right-padded responses. Sample ``i * n + j``
is the j-th answer to prompt ``i``; ``group_index`` records ``i``.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Protocol

import torch

from danka.errors import UserError
from danka.types import RolloutBatch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # samples per prompt
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 128

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class RolloutEngine(Protocol):
    name: str

    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        *,
        eos_ids: list[int],
        pad_id: int,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """Sample ``params.n`` responses for each prompt (token ids, no padding)."""
        ...


ROLLOUT_ENGINES: dict[str, type] = {}


def register_engine(name: str):
    def deco(cls: type) -> type:
        if name in ROLLOUT_ENGINES:
            raise ValueError(f"rollout engine {name!r} is registered twice")
        cls.name = name
        ROLLOUT_ENGINES[name] = cls
        return cls

    return deco


def build_engine(name: str, **options) -> RolloutEngine:
    """The engine ``name`` with typed ``options``; one it does not take is a UserError (exit 2
    at start-up), never silently dropped."""
    # Import the engines so they register themselves.
    from danka.rollout import fast, hf  # noqa: F401

    if name not in ROLLOUT_ENGINES:
        raise UserError(
            f"unknown rollout engine {name!r}",
            where="rollout.engine",
            fix=f"use one of: {', '.join(sorted(ROLLOUT_ENGINES))} (or auto)",
        )
    cls = ROLLOUT_ENGINES[name]
    accepted = inspect.signature(cls).parameters
    for key in options:
        if key not in accepted:
            raise UserError(
                f"the {name} rollout engine has no option {key!r}",
                where="rollout",
                fix=f"its options: {', '.join(accepted) or 'none'}; or choose another engine",
            )
    return cls(**options)


def choose_engine(
    cfg, device: torch.device, *, model_config=None, free_bytes: int | None = None
) -> tuple[str, str]:
    """``rollout.engine`` resolved to "hf" or "fast", with the reason to log.

    Order: an explicit ``rollout.engine``; the seed's ``backend.hf_transformers.
    enable_hf_transformers: true`` (HF); no CUDA device or a quantised base (HF); a model
    type the fast engine does not run (HF); else fast only when ``danka estimate``'s whole
    step with the fast engine fits the free GPU memory (``free_bytes``, default: now).
    """
    from danka.rollout.fast_weights import SUPPORTED_MODEL_TYPES
    from danka.tools.estimate import GIB, OVERHEAD_BYTES, estimate_memory, load_model_config

    r, m = cfg.rollout, cfg.model
    if r.engine != "auto":
        return r.engine, f"rollout.engine: {r.engine}"
    if cfg.backend.hf_transformers.enable_hf_transformers:
        return "hf", "backend.hf_transformers.enable_hf_transformers: true"
    if device.type != "cuda":
        return "hf", f"no CUDA device ({device}): HF generate"
    if m.load_in_4bit or m.load_in_8bit:
        return "hf", "quantised base: the fast engine reads plain bf16/fp32 weights"
    config = model_config or load_model_config(m.actor_model_name_or_path)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return "hf", f"the fast engine does not run model type {config.model_type!r}"
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    plans = {}
    for name in ("fast", "hf"):
        c = copy.deepcopy(cfg)
        c.rollout.engine = name
        plans[name] = estimate_memory(c, model_config=config)["peak"] + OVERHEAD_BYTES
    need = f"{plans['fast'] / GIB:.1f} GiB (HF {plans['hf'] / GIB:.1f})"
    free = f"{free_bytes / GIB:.1f} GiB free"
    if plans["fast"] <= free_bytes:
        return "fast", f"the whole step with the fast engine fits: {need} of {free}"
    return "hf", f"the fast engine's step would need {need}, more than {free}"


def finish_batch(
    prompt_ids: list[list[int]],
    responses: list[list[int]],
    n: int,
    *,
    eos_ids: list[int],
    pad_id: int,
    max_new_tokens: int,
    logprobs: list[list[float]] | None = None,
) -> RolloutBatch:
    """Pack per-sample token lists into a RolloutBatch.

    ``responses[k]`` is cut after its first EOS; a response without EOS that reached
    ``max_new_tokens`` is marked truncated.
    """
    eos = set(eos_ids)
    cut: list[list[int]] = []
    truncated: list[bool] = []
    for resp in responses:
        end = next((t + 1 for t, tok in enumerate(resp) if tok in eos), None)
        cut.append(resp[:end] if end is not None else resp[:max_new_tokens])
        truncated.append(end is None)
    b = len(cut)
    plen = max(len(p) for p in prompt_ids)
    rlen = max(1, max(len(r) for r in cut))
    p_ids = torch.full((b, plen), pad_id, dtype=torch.long)
    p_mask = torch.zeros((b, plen), dtype=torch.long)
    r_ids = torch.full((b, rlen), pad_id, dtype=torch.long)
    r_mask = torch.zeros((b, rlen), dtype=torch.float32)
    lp = torch.zeros((b, rlen), dtype=torch.float32) if logprobs is not None else None
    for k, resp in enumerate(cut):
        prompt = prompt_ids[k // n]
        p_ids[k, plen - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        p_mask[k, plen - len(prompt) :] = 1
        if resp:
            r_ids[k, : len(resp)] = torch.tensor(resp, dtype=torch.long)
            r_mask[k, : len(resp)] = 1.0
            if lp is not None:
                lp[k, : len(resp)] = torch.tensor(logprobs[k][: len(resp)], dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=r_ids,
        response_mask=r_mask,
        group_index=torch.arange(b, dtype=torch.long) // n,
        truncated=torch.tensor(truncated, dtype=torch.bool),
        rollout_logprobs=lp,
    )
