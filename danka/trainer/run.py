"""Everything a training run holds, built once from the validated (read-only) config.

``Run`` holds long-lived objects only; what changes during a run is in ``RunState``
(the config never changes after validation). The stages of a step never see a ``Run``:
``build_stages`` (danka/trainer/stages.py) hands each one what it needs, and what one
step produces travels on the typed records of danka/trainer/records.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from danka.agent.loop import AgentLoop
from danka.algorithms.advantages import AdvantageInput, EstimatorMeta
from danka.algorithms.kl import AdaptiveKLController, FixedKLController, KLModeMeta
from danka.algorithms.losses import PolicyLossParams
from danka.algorithms.rollout_correction import Correction
from danka.config.schema import DankaConfig
from danka.rewards.combine import RewardComputer
from danka.rollout.base import RolloutEngine
from danka.trainer.dynamic_sampling import DynamicSampler
from danka.trainer.models import ModelSet
from danka.trainer.sampler import PromptSampler
from danka.trainer.state import RunState
from danka.types import PromptRow


@dataclass
class PromptSet:
    """Prompts ready for the rollout: rows, rendered text and token ids (no padding)."""

    rows: list[PromptRow]
    texts: list[str]
    ids: list[list[int]]


@dataclass(frozen=True)
class Algorithm:
    """The config's algorithm choices, looked up in the registries once."""

    estimator: Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor | None]]
    estimator_meta: EstimatorMeta
    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    loss_params: PolicyLossParams
    kl_estimator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    kl_mode: KLModeMeta | None  # None: no KL term (kl.coef == 0)
    correction: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Correction] | None
    correction_cap: float

    @property
    def needs_critic(self) -> bool:
        return self.estimator_meta.needs_critic

    @property
    def needs_reference(self) -> bool:
        return self.kl_mode is not None


@dataclass
class Run:
    cfg: DankaConfig
    base_dir: Path
    output_dir: Path
    device: torch.device
    dtype: torch.dtype
    tokenizer: PreTrainedTokenizerBase
    models: ModelSet
    engine: RolloutEngine
    rewards: RewardComputer
    train: PromptSet
    eval: PromptSet | None
    algo: Algorithm
    actor_opt: torch.optim.Optimizer
    actor_sched: torch.optim.lr_scheduler.LRScheduler
    critic_opt: torch.optim.Optimizer | None
    critic_sched: torch.optim.lr_scheduler.LRScheduler | None
    kl_ctl: FixedKLController | AdaptiveKLController
    sampler: PromptSampler
    log: logging.Logger
    state: RunState
    update_generator: torch.Generator = field(default_factory=torch.Generator)
    eos_ids: list[int] = field(default_factory=list)
    pad_id: int = 0
    dynamic: DynamicSampler | None = None  # sampling.dynamic_sampling (DAPO), else None
    agent: AgentLoop | None = None  # the multi-turn loop of agent.tools / environment

    @property
    def pack_len(self) -> int | None:
        """Tokens per packed row in the update, or None (length-grouped padded micro-batches)."""
        return self.cfg.speed.max_packed_length if self.cfg.speed.packing else None

    @property
    def temperature(self) -> float:
        t = self.cfg.sampling.temperature
        return t if t > 0 else 1.0
