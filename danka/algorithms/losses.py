"""Policy losses, loss aggregation and the critic's value loss.

Every policy loss is ``fn(inputs, params, norm) -> (loss, metrics)`` with the (B, R) tensors
of one MICRO-batch in ``inputs`` (:class:`PolicyLossInput`), a scalar loss and metrics as
detached 0-d tensors (no host sync per micro-batch; the trainer reads them once per update).

Micro-batch invariance: ``LossNorm`` carries counts for the whole MINI-batch (one
optimiser step), so each micro-batch loss is already divided by the global normaliser
and summing micro-batch losses (or accumulating their gradients) gives exactly the
mini-batch loss. Do not divide by the number of micro-batches again. Metrics are
masked means over the micro-batch only (for logging).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from danka.algorithms._masked import masked_mean
from danka.errors import UserError
from danka.registry import Registry

POLICY_LOSSES = Registry("policy loss")

AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


@dataclass
class PolicyLossParams:
    """Knobs shared by the policy losses (config: the policy-loss section)."""

    clip_low: float = 0.2  # ratio lower bound 1 - clip_low
    clip_high: float = 0.2  # ratio upper bound 1 + clip_high; > clip_low = clip-higher (DAPO)
    dual_clip_c: float | None = 3.0  # dual clip for A < 0 (Ye et al. 2020); None = off
    log_ratio_clamp: float = 20.0  # |log pi/pi_old| clamp before exp, avoids inf
    agg_mode: str = "token-mean"  # one of AGG_MODES

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low < 1):
            raise UserError(
                f"clip_low must be in [0, 1), got {self.clip_low}",
                where="config",
                fix="use e.g. clip_low=0.2 (PPO) or 3e-4 (GSPO)",
            )
        if self.clip_high < 0:
            raise UserError(
                f"clip_high must be >= 0, got {self.clip_high}",
                where="config",
                fix="use e.g. clip_high=0.2, or 0.28 for DAPO's clip-higher",
            )
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise UserError(
                f"dual_clip_c must be > 1, got {self.dual_clip_c}",
                where="config",
                fix="use e.g. dual_clip_c=3.0, or null to turn dual clip off",
            )
        if self.log_ratio_clamp <= 0:
            raise UserError(
                f"log_ratio_clamp must be > 0, got {self.log_ratio_clamp}",
                where="config",
                fix="use the default log_ratio_clamp=20.0",
            )
        check_agg_mode(self.agg_mode, where="config")


@dataclass
class LossNorm:
    """Global normalisers for one mini-batch (all its micro-batches together)."""

    num_tokens: float  # valid response tokens in the mini-batch
    num_seqs: float  # sequences in the mini-batch
    max_response_length: int  # R used by seq-mean-token-sum-norm (config max_new_tokens)

    @classmethod
    def from_mask(cls, response_mask: torch.Tensor, max_response_length: int | None = None):
        """Counts of a whole mini-batch's (B, R) mask; R defaults to its width."""
        return cls(
            num_tokens=float(response_mask.sum().item()),
            num_seqs=float(response_mask.shape[0]),
            max_response_length=int(max_response_length or response_mask.shape[1]),
        )


def check_agg_mode(mode: str, where: str | None = None) -> None:
    """UserError listing the valid modes if ``mode`` is not one of AGG_MODES."""
    if mode not in AGG_MODES:
        raise UserError(
            f"unknown loss aggregation mode {mode!r}",
            where=where,
            fix=f"use one of: {', '.join(AGG_MODES)}",
        )


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: LossNorm
) -> torch.Tensor:
    """Reduce a (B, R) per-token loss to a scalar with GLOBAL normalisers.

    token-mean:              sum_{i,t} x m / num_tokens
    seq-mean-token-sum:      sum_i (sum_t x m) / num_seqs
    seq-mean-token-mean:     sum_i (sum_t x m / sum_t m) / num_seqs
    seq-mean-token-sum-norm: sum_{i,t} x m / (num_seqs * max_response_length)  (Dr. GRPO,
                             Liu et al. 2025: a constant divisor removes the length bias)
    """
    check_agg_mode(mode)
    masked = per_token * mask
    num_seqs = max(norm.num_seqs, 1.0)  # an empty mini-batch gives 0, not NaN
    if mode == "token-mean":
        return masked.sum() / max(norm.num_tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return masked.sum() / num_seqs
    if mode == "seq-mean-token-mean":
        seq_len = mask.sum(dim=-1).clamp(min=1.0)
        return (masked.sum(dim=-1) / seq_len).sum() / num_seqs
    return masked.sum() / (num_seqs * max(norm.max_response_length, 1))


@dataclass
class PolicyLossInput:
    """What a policy loss reads, for one MICRO-batch; every tensor (B, R)."""

    logprobs: torch.Tensor  # log pi(y_t) under the policy being trained (with gradient)
    old_logprobs: torch.Tensor  # log pi_old(y_t), the policy that sampled (no gradient)
    advantages: torch.Tensor  # per-token advantage A
    response_mask: torch.Tensor  # 1 on the tokens the loss counts, 0 elsewhere


PolicyLoss = Callable[
    [PolicyLossInput, PolicyLossParams, LossNorm], tuple[torch.Tensor, dict[str, torch.Tensor]]
]


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi_old || pi) per token from log(pi / pi_old): r - 1 - log r."""
    return torch.exp(log_ratio) - 1 - log_ratio


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, params: PolicyLossParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, clipped)`` per token: L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
    and where the clip bound is the active (larger) term."""
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - params.clip_low, 1 + params.clip_high)
    return torch.maximum(loss_unclipped, loss_clipped), loss_clipped > loss_unclipped


@POLICY_LOSSES.register("vanilla")
def vanilla(
    x: PolicyLossInput, params: PolicyLossParams, norm: LossNorm
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) per token:

    r = exp(clamp(logp - logp_old, +-log_ratio_clamp))
    L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))     (clip-higher: DAPO,
                                                                Yu et al. 2025)
    for A < 0 with dual clip: L = min(L, -A c)                  (Ye et al. 2020,
                                                                arXiv:1912.09729)
    then ``aggregate(L, mask, params.agg_mode, norm)``.
    Metrics: clipfrac (tokens where the clip bound is active), clipfrac_lower (tokens
    where the dual clip is active), approx_kl (k3 of KL(old || new)), ratio_mean.
    """
    mask = x.response_mask
    log_ratio = torch.clamp(
        x.logprobs - x.old_logprobs, -params.log_ratio_clamp, params.log_ratio_clamp
    )
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_surrogate(ratio, x.advantages, params)
    clipfrac = masked_mean(clipped.float(), mask)
    dual_frac = torch.zeros((), device=mask.device)
    if params.dual_clip_c is not None:
        loss_dual = -x.advantages * params.dual_clip_c
        negative = x.advantages < 0
        dual_frac = masked_mean(((loss > loss_dual) & negative).float(), mask)
        loss = torch.where(negative, torch.minimum(loss, loss_dual), loss)
    total = aggregate(loss, mask, params.agg_mode, norm)
    with torch.no_grad():
        metrics = {
            "clipfrac": clipfrac.detach(),
            "clipfrac_lower": dual_frac,
            "approx_kl": masked_mean(_k3(log_ratio.detach()), mask),
            "ratio_mean": _ratio_mean(ratio.detach(), mask),
        }
    return total, metrics


def _ratio_mean(ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean ratio over the masked tokens; 1.0 (no move) when the micro-batch has none.

    ``masked_mean`` gives 0 for an empty mask, and micro-batches are length-sorted, so
    with ``loss.mask_truncated`` the truncated (longest) samples fill whole micro-batches
    with no trained token: averaged over micro-batches, those zeros read as ratio 0.75 on
    a run that is exactly on-policy (ratio 1 on every trained token)."""
    return torch.where(mask.sum() > 0, masked_mean(ratio, mask), torch.ones_like(ratio[0, 0]))


@POLICY_LOSSES.register("gspo")
def gspo(
    x: PolicyLossInput, params: PolicyLossParams, norm: LossNorm
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimisation (Zheng et al. 2025, arXiv:2507.18071).

    Sequence ratio s_i = exp(mean_t (logp - logp_old)) over valid tokens, clipped to
    [1 - clip_low, 1 + clip_high] (the paper uses ~3e-4 / 4e-4, far tighter than PPO).
    Written in the paper's GSPO-token form s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]:
    its value is s_i on every token and its gradient is s_i * grad log pi(y_t), so with a
    sequence-level advantage it equals GSPO and works with any ``agg_mode`` (the paper
    and verl use ``seq-mean-token-mean``). No dual clip.
    Metrics: clipfrac (valid tokens whose sequence ratio is clipped), approx_kl (k3 per
    token), ratio_mean (mean sequence ratio over sequences).
    """
    mask = x.response_mask
    log_ratio = x.logprobs - x.old_logprobs
    seq_len = mask.sum(dim=-1).clamp(min=1.0)
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / seq_len  # (B,)
    token_log_ratio = x.logprobs - x.logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    token_log_ratio = torch.clamp(token_log_ratio, max=params.log_ratio_clamp)
    loss, clipped = _clipped_surrogate(torch.exp(token_log_ratio), x.advantages, params)
    total = aggregate(loss, mask, params.agg_mode, norm)
    with torch.no_grad():
        has_token = mask.sum(dim=-1) > 0
        seq_ratio = torch.exp(seq_log_ratio.detach().clamp(max=params.log_ratio_clamp))
        metrics = {
            "clipfrac": masked_mean(clipped.float(), mask),
            "approx_kl": masked_mean(_k3(log_ratio.detach().clamp(-20, 20)), mask),
            # mean over sequences with a token; 1.0 when none has one
            "ratio_mean": torch.where(
                has_token.any(),
                (seq_ratio * has_token).sum() / has_token.sum().clamp(min=1),
                torch.ones((), device=seq_ratio.device),
            ),
        }
    return total, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float,
    norm: LossNorm,
    agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped critic loss (PPO, as in verl/OpenAI baselines), (B, R) inputs:

    v_clip = old_values + clamp(values - old_values, -clip_range, clip_range)
    L = 0.5 * aggregate(max((values - returns)^2, (v_clip - returns)^2))
    Metrics: vf_clipfrac (tokens where the clipped error is larger), vpred_mean.
    """
    v_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    err_unclipped = (values - returns) ** 2
    err_clipped = (v_clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(err_unclipped, err_clipped), mask, agg_mode, norm)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean((err_clipped > err_unclipped).float(), mask),
            "vpred_mean": masked_mean(values.detach(), mask),
        }
    return loss, metrics
