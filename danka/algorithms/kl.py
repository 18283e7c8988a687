"""Per-token KL estimators, KL coefficient controllers, and the KL penalty in the reward.

Every estimator is ``fn(logprobs (B, R), ref_logprobs (B, R)) -> (B, R)``, estimating
KL(pi || pi_ref) from tokens sampled from pi, with log p = logprobs and log q =
ref_logprobs (Schulman 2020, "Approximating KL Divergence",
http://joschu.net/blog/kl-approx.html). The caller masks and aggregates, e.g. with
``losses.aggregate`` for a KL loss term.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from danka.algorithms._masked import masked_mean
from danka.errors import UserError
from danka.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@KL_ESTIMATORS.register("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log p - log q: unbiased, high variance, can be negative per token."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log p - log q)^2: biased, low variance, >= 0."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(log q - log p) - (log q - log p) - 1: unbiased, low variance, >= 0.

    As verl's ``low_var_kl``: log q - log p is clamped to [-20, 20] before exp and the
    result to [-10, 10], so one badly off token cannot blow up the loss.
    """
    log_ratio = torch.clamp(ref_logprobs - logprobs, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, min=-10.0, max=10.0)


@KL_ESTIMATORS.register("abs")
def abs_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """|log p - log q|: a >= 0 penalty (not an unbiased KL estimate)."""
    return (logprobs - ref_logprobs).abs()


class FixedKLController:
    """Constant KL coefficient; ``update`` does nothing."""

    def __init__(self, coef: float):
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, sec. 2.2):

    e = clip(current_kl / target - 1, -0.2, 0.2)
    value <- value * (1 + e * n_steps / horizon)

    The coefficient grows when the measured KL is above ``target`` and shrinks below it;
    ``n_steps`` is the number of samples the KL was measured on (verl passes batch size).
    ``current_kl`` and ``target`` are the MEAN KL PER RESPONSE TOKEN of the step's batch
    (mean over sequences of each sequence's token-mean KL), as verl's
    ``AdaptiveKLController`` is fed; not Ziegler et al.'s per-sequence sum. The trainer
    updates it once per step under both ``kl.mode: reward`` and ``kl.mode: loss``.
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise UserError(
                f"adaptive KL needs target > 0 and horizon > 0 (got {target}, {horizon})",
                where="config",
                fix="use e.g. target=0.1 (mean KL per response token, as verl) and horizon=10000",
            )
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))


@torch.no_grad()
def apply_kl_in_reward(
    token_rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str,
    coef: float,
) -> tuple[torch.Tensor, float]:
    """Per-token KL penalty in the reward (Ziegler et al. 2019; verl ``apply_kl_penalty``).

    kl = KL_ESTIMATORS[estimator](logprobs, ref_logprobs) * mask          (B, R)
    returns (token_rewards - coef * kl, mean_kl) where mean_kl is the mean over
    sequences of each sequence's mean per-token KL (what verl feeds its controller).
    ``logprobs`` are the rollout policy's (old) log-probs. Unknown estimator -> UserError.
    """
    kl = KL_ESTIMATORS.get(estimator, where="config")(logprobs, ref_logprobs) * mask
    per_seq = masked_mean(kl, mask, dim=-1)
    mean_kl = float(per_seq.mean()) if per_seq.numel() else 0.0
    return token_rewards - coef * kl, mean_kl


@dataclass(frozen=True)
class KLModeMeta:
    """Where the KL(pi || pi_ref) penalty enters (``loss.kl.mode``)."""

    in_loss: bool = False  # coef * aggregate(kl) added to the policy loss (GRPO)
    in_reward: bool = False  # coef * kl subtracted from the token rewards (PPO, Ziegler)


KL_MODES: Registry[KLModeMeta] = Registry("KL mode")
KL_MODES.add("loss", "added to the policy loss", KLModeMeta(in_loss=True))
KL_MODES.add("reward", "subtracted from the token rewards", KLModeMeta(in_reward=True))
