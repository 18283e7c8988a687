"""Everything a training run holds, built once from the validated config."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from danka.config.schema import DankaConfig
from danka.types import PromptRow, RolloutBatch


@dataclass
class PromptSet:
    """Prompts ready for the rollout: rows, rendered text and token ids (no padding)."""

    rows: list[PromptRow]
    texts: list[str]
    ids: list[list[int]]


@dataclass
class Run:
    cfg: DankaConfig
    base_dir: Path
    output_dir: Path
    device: torch.device
    dtype: torch.dtype
    tokenizer: Any
    models: Any  # trainer.models.ModelSet
    engine: Any  # rollout engine
    rewards: Any  # rewards.combine.RewardComputer
    train: PromptSet
    eval: PromptSet | None
    actor_opt: torch.optim.Optimizer
    actor_sched: Any
    kl_ctl: Any
    sampler: Any  # trainer.sampler.PromptSampler
    log: logging.Logger
    total_steps: int
    critic_opt: torch.optim.Optimizer | None = None
    critic_sched: Any = None
    update_generator: torch.Generator = field(default_factory=torch.Generator)
    eos_ids: list[int] = field(default_factory=list)
    pad_id: int = 0
    last_prompt_idx: list[int] = field(default_factory=list)  # prompts of the current step
    last_reward_parts: dict = field(default_factory=dict)  # name -> (B,) unweighted rewards

    @property
    def pack_len(self) -> int | None:
        """Tokens per packed row in the update, or None (length-grouped padded micro-batches)."""
        return self.cfg.data.max_packed_length if self.cfg.data.packing else None

    @property
    def temperature(self) -> float:
        t = self.cfg.trainer.temperature
        return t if t > 0 else 1.0

    def decode(self, batch: RolloutBatch) -> list[str]:
        out = []
        for ids, mask in zip(batch.response_ids, batch.response_mask):
            out.append(self.tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True))
        return out
