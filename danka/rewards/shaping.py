"""Reward shaping applied to a step's scores before advantages: DAPO's overlong penalty.

DAPO (Yu et al. 2025, https://arxiv.org/abs/2503.14476, section 3.4 "Overlong Reward
Shaping"; verl's ``reward_model.overlong_buffer``) replaces the hard "truncated = 0" signal
by a soft linear penalty in the last ``buffer`` tokens before the cap ``L_max``:

    expected = L_max - buffer
    penalty(L) = 0                                       if L <= expected
               = -(L - expected) / buffer * penalty      if expected < L < L_max
               = -penalty                                if L >= L_max

where ``L`` is the response length in tokens. The result is ADDED to the sample's reward.
"""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, *, max_new_tokens: int, buffer: int, penalty: float
) -> torch.Tensor:
    """The (B,) float32 penalty (<= 0) for response ``lengths`` (B,) in tokens.

    ``buffer`` = 0 gives zeros (shaping off). ``0 < buffer < max_new_tokens`` else
    ValueError (the config refuses such values first).
    """
    if buffer == 0:
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)
    if not 0 < buffer < max_new_tokens or penalty < 0:
        raise ValueError(
            f"need 0 < buffer ({buffer}) < max_new_tokens ({max_new_tokens}) and penalty >= 0"
        )
    expected = max_new_tokens - buffer
    over = (lengths.float() - expected).clamp(min=0.0, max=float(buffer))
    return -over / buffer * penalty


def response_lengths(response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) token counts of (B, R) response masks (generated tokens up to and incl. EOS)."""
    return response_mask.sum(-1)
