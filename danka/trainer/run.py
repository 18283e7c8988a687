"""Two things a run builds once and every stage reads: its prompt sets and its algorithm
(the config's choices looked up in the registries). The rest is bound stage by stage in
danka/trainer/stages.py and put together in danka/trainer/build.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from danka.algorithms.advantages import AdvantageInput, EstimatorMeta
from danka.algorithms.kl import KLModeMeta
from danka.algorithms.losses import PolicyLossParams
from danka.algorithms.rollout_correction import Correction
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
