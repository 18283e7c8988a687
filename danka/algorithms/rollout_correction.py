"""Rollout/trainer mismatch correction: the samples come from the rollout engine's
distribution (pi_rollout: bf16 kernels, a fast engine, a lagging weight copy) while the
loss treats them as samples of pi_old (the training forward). Importance sampling
between the two corrects the gradient.

Every entry is ``fn(old_logprobs (B, R), rollout_logprobs (B, R), mask (B, R), threshold)
-> Correction`` with log-probs of the sampled tokens and ``mask`` the loss mask (1 on
trained tokens). The per-token ratio is w_t = exp(old_t - rollout_t) = pi_old / pi_rollout.

- ``token_tis``: truncated importance sampling per token, weight = min(w_t, threshold),
  multiplied into the per-token policy loss (TRL's ``vllm_importance_sampling_correction``
  with ``vllm_importance_sampling_mode: token_truncate``, cap 3.0 by default since TRL 0.26;
  verl's ``algorithm.rollout_correction`` ``rollout_is: token``; Yao et al. 2025, "Your
  efficient RL framework secretly brings you off-policy RL training").
- ``seq_mask``: masked importance sampling per sequence: the sequence ratio
  prod_t w_t = exp(sum_t (old_t - rollout_t)) outside [1/threshold, threshold] drops the
  whole sequence from the loss (verl's ``rollout_rs: seq_mask``-style rejection, threshold
  2.0 in verl's examples; TRL's ``sequence_mask`` mode).
- ``none``: no correction (the registered entry is None).

Metrics are measured BEFORE truncation/masking: ``rollout_is/mean`` and ``rollout_is/max``
of the token ratio (token_tis) or of the sequence ratio (seq_mask), and the fraction of
tokens clipped (``rollout_is/clipped_frac``) or of sequences masked
(``rollout_is/masked_frac``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from danka.algorithms._masked import masked_mean
from danka.registry import Registry

LOG_CLAMP = 20.0  # |log ratio| clamp before exp, as the policy losses


@dataclass
class Correction:
    """What a correction does to the loss. B = samples, R = response length."""

    weights: torch.Tensor  # (B, R) float >= 0, multiplied into the per-token policy loss
    keep: torch.Tensor  # (B,) bool, False = sequence dropped from the loss
    metrics: dict[str, float] = field(default_factory=dict)


RolloutCorrection = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Correction]
ROLLOUT_CORRECTIONS: Registry[None] = Registry("rollout correction")
ROLLOUT_CORRECTIONS.add("none", None)  # no correction: the entry is None


def _log_ratio(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.clamp((old - rollout) * mask, -LOG_CLAMP, LOG_CLAMP)


def _token_stats(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    has = mask > 0
    return {
        "rollout_is/mean": float(masked_mean(ratio, mask)),
        "rollout_is/max": float(ratio[has].max()) if has.any() else 1.0,
    }


@ROLLOUT_CORRECTIONS.register("token_tis")
@torch.no_grad()
def token_tis(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, threshold: float
) -> Correction:
    """Token-level truncated IS: weight_t = min(exp(old_t - rollout_t), threshold)."""
    ratio = torch.exp(_log_ratio(old_logprobs, rollout_logprobs, mask))
    metrics = _token_stats(ratio, mask)
    metrics["rollout_is/clipped_frac"] = float(masked_mean((ratio > threshold).float(), mask))
    keep = torch.ones(ratio.shape[0], dtype=torch.bool, device=ratio.device)
    return Correction(ratio.clamp(max=threshold) * mask, keep, metrics)


@ROLLOUT_CORRECTIONS.register("seq_mask")
@torch.no_grad()
def seq_mask(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, threshold: float
) -> Correction:
    """Sequence-level masking: keep sequence i iff 1/threshold <= exp(sum_t log w_t) <=
    threshold (sum over its loss tokens)."""
    seq_log = (_log_ratio(old_logprobs, rollout_logprobs, mask)).sum(dim=-1)
    seq_ratio = torch.exp(seq_log.clamp(-LOG_CLAMP, LOG_CLAMP))
    has = mask.sum(dim=-1) > 0
    keep = (seq_ratio <= threshold) & (seq_ratio >= 1.0 / threshold) | ~has
    shown = seq_ratio[has] if has.any() else torch.ones(1)
    metrics = {
        "rollout_is/mean": float(shown.mean()),
        "rollout_is/max": float(shown.max()),
        "rollout_is/masked_frac": float((~keep[has]).float().mean()) if has.any() else 0.0,
    }
    return Correction(torch.ones_like(mask, dtype=torch.float32) * mask, keep, metrics)
