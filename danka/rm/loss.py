"""The Bradley-Terry pairwise loss of a reward model and its held-out statistics.

Bradley & Terry (1952); as a reward-model loss: Ouyang et al. 2022
(https://arxiv.org/abs/2203.02155), with the margin of Touvron et al. 2023 (Llama 2,
https://arxiv.org/abs/2307.09288) and the reward centering of Eisenstein et al. 2023
(https://arxiv.org/abs/2312.09244), as TRL's RewardTrainer writes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    r_chosen: torch.Tensor,
    r_rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_coef: float | None = None,
) -> torch.Tensor:
    """Scalar loss over P pairs; ``r_chosen``, ``r_rejected``, ``margin``: (P,).

        loss = mean_p[ -log sigmoid(r_c - r_r - m) ] + c * mean_p[ (r_c + r_r)^2 ]

    ``m`` = ``margin`` (0 when None), ``c`` = ``center_coef`` (no centering when None):
    the centering term pulls the rewards towards mean 0 without changing their order.
    """
    diff = r_chosen - r_rejected
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * ((r_chosen + r_rejected) ** 2).mean()
    return loss


def pair_stats(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> dict[str, float]:
    """Held-out statistics of P pairs' rewards (P,):

    - ``accuracy``: fraction with r_c > r_r (a tie counts as wrong);
    - ``margin``: mean of r_c - r_r;
    - ``mean`` / ``std``: of all 2P rewards (std with Bessel's correction);
    - ``n``: P.
    """
    rewards = torch.cat([r_chosen, r_rejected]).float()
    return {
        "accuracy": float((r_chosen > r_rejected).float().mean()),
        "margin": float((r_chosen - r_rejected).float().mean()),
        "mean": float(rewards.mean()),
        "std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "n": int(r_chosen.numel()),
    }
