"""Typed data that crosses stage boundaries. Shapes: B = samples in a step, P = prompt
length (left-padded), R = response length (right-padded)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PromptRow:
    """One training or evaluation prompt, whatever file format it came from."""

    index: int  # row index in its source file (0-based), for error messages and data order
    prompt: str | list[dict[str, str]]  # plain text, or chat messages [{"role", "content"}]
    ground_truth: str | None = None  # reference answer for rule rewards (None if unknown)
    data_source: str = "unknown"  # verl's data_source, picks a default rule reward
    extra: dict[str, Any] = field(default_factory=dict)  # other columns, passed to rewards


@dataclass
class RolloutBatch:
    """Everything that crosses from rollout to update; each field means one thing.

    The rollout fills the first block; the trainer fills the optional block in order
    (rewards -> old/ref log-probs -> values -> advantages/returns).
    """

    prompt_ids: torch.Tensor  # (B, P) long, left-padded with the pad id
    prompt_mask: torch.Tensor  # (B, P) long, 1 on real prompt tokens
    response_ids: torch.Tensor  # (B, R) long, right-padded with the pad id
    response_mask: torch.Tensor  # (B, R) float, 1 on generated tokens up to and incl. EOS
    group_index: torch.Tensor  # (B,) long, which prompt of the step the sample answers
    truncated: torch.Tensor  # (B,) bool, hit max_new_tokens before EOS
    rollout_logprobs: torch.Tensor | None = None  # (B, R) log-probs reported by the engine
    rewards: torch.Tensor | None = None  # (B,) float, combined sequence-level score
    old_logprobs: torch.Tensor | None = None  # (B, R) log pi_old(token), training forward
    ref_logprobs: torch.Tensor | None = None  # (B, R) log pi_ref(token)
    values: torch.Tensor | None = None  # (B, R) critic values V(s_t)
    advantages: torch.Tensor | None = None  # (B, R)
    returns: torch.Tensor | None = None  # (B, R) critic targets

    @property
    def size(self) -> int:
        return int(self.prompt_ids.shape[0])

    def select(self, idx: torch.Tensor) -> RolloutBatch:
        """Rows ``idx`` of every tensor field (for mini- and micro-batches)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value[idx] if isinstance(value, torch.Tensor) else value
        return RolloutBatch(**out)

    def to(self, device: torch.device | str) -> RolloutBatch:
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.to(device) if isinstance(value, torch.Tensor) else value
        return RolloutBatch(**out)
