"""The algorithm a run trains with: the config's choices looked up in the registries once
(the estimator, the policy loss, the KL term, the rollout correction). Every stage reads it;
the rest is bound stage by stage in danka/step/stages.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from danka.algorithms.advantages import AdvantageInput, EstimatorMeta
from danka.algorithms.kl import KLModeMeta
from danka.algorithms.losses import PolicyLossParams
from danka.algorithms.rollout_correction import Correction


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
