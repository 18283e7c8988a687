"""The rollout interface: prompts in, one ``RolloutBatch`` out.

Every engine samples ``n`` responses per prompt from the *live* policy (LoRA adapters
active, no merge and no weight copy) and returns right-padded responses. Sample ``i * n + j``
is the j-th answer to prompt ``i``; ``group_index`` records ``i``.
"""

from __future__ import annotations

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


def build_engine(name: str, **kwargs) -> RolloutEngine:
    # Import the engines so they register themselves.
    from danka.rollout import fast, hf  # noqa: F401

    if name not in ROLLOUT_ENGINES:
        raise UserError(
            f"unknown rollout engine {name!r}",
            where="rollout.engine",
            fix=f"use one of: {', '.join(sorted(ROLLOUT_ENGINES))} (or auto)",
        )
    return ROLLOUT_ENGINES[name](**kwargs)


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
