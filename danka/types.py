"""Typed data that crosses stage boundaries. Shapes: B = samples in a step, P = prompt
length (left-padded), R = response length (right-padded)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    """The only thing that crosses from rollout to update; each field means one thing.

    The rollout engine fills the first block (``loss_mask``, ``valid`` and
    ``prompt_index`` get their single-turn defaults when left None). The training loop
    fills the second block in order: rewards (step 3) -> old/ref log-probs (4) ->
    values (5) -> advantages/returns (6).

    Masks: ``response_mask`` says which response tokens EXIST (generated, up to and
    including EOS); ``loss_mask`` says which of them the loss trains on (equal for a
    single-turn rollout; an agentic rollout zeroes tool-output tokens in it). Every loss,
    aggregation and advantage uses ``train_mask`` = loss_mask on valid samples. A sample
    is dropped (reward skipped, rollout correction) by ``valid``, never by zeroing a mask.
    """

    prompt_ids: torch.Tensor  # (B, P) long, left-padded with the pad id
    prompt_mask: torch.Tensor  # (B, P) long, 1 on real prompt tokens
    response_ids: torch.Tensor  # (B, R) long, right-padded with the pad id
    response_mask: torch.Tensor  # (B, R) float, 1 on generated tokens up to and incl. EOS
    group_index: torch.Tensor  # (B,) long, which prompt of the step the sample answers
    truncated: torch.Tensor  # (B,) bool, hit max_new_tokens before EOS
    rollout_logprobs: torch.Tensor | None = None  # (B, R) log-probs reported by the engine
    loss_mask: torch.Tensor | None = None  # (B, R) float, tokens the loss trains on
    valid: torch.Tensor | None = None  # (B,) bool, sample usable (default all True)
    prompt_index: torch.Tensor | None = None  # (B,) long, row of the prompt set answered
    # filled by the training loop
    rewards: torch.Tensor | None = None  # (B,) float, combined (weighted) sequence score
    reward_parts: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> (B,) unweighted
    old_logprobs: torch.Tensor | None = None  # (B, R) log pi_old(token), training forward
    # True: pi_old IS the policy at the update's only optimiser step, so old_logprobs is
    # left None and the update uses its own detached log-probs (one forward pass saved)
    old_is_current: bool = False
    ref_logprobs: torch.Tensor | None = None  # (B, R) log pi_ref(token)
    is_weights: torch.Tensor | None = None  # (B, R) rollout-correction weight per token
    values: torch.Tensor | None = None  # (B, R) critic values V(s_t)
    advantages: torch.Tensor | None = None  # (B, R), 0 off train_mask
    returns: torch.Tensor | None = None  # (B, R) critic targets; None without a critic

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.response_mask.clone()
        if self.valid is None:
            self.valid = torch.ones(self.response_ids.shape[0], dtype=torch.bool)
        if self.prompt_index is None:
            self.prompt_index = self.group_index.clone()

    @property
    def size(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def train_mask(self) -> torch.Tensor:
        """(B, R) float: ``loss_mask`` with the rows of invalid samples zeroed."""
        return self.loss_mask * self.valid.to(self.loss_mask.dtype).unsqueeze(-1)

    def _map(self, fn) -> RolloutBatch:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = fn(value)
            elif isinstance(value, dict):
                value = {k: fn(v) for k, v in value.items()}
            out[f.name] = value
        return RolloutBatch(**out)

    def select(self, idx: torch.Tensor) -> RolloutBatch:
        """Rows ``idx`` of every tensor field (for mini- and micro-batches)."""
        return self._map(lambda v: v[idx])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RolloutBatch:
        """The batch on ``device``. ``non_blocking`` to a CUDA device copies CPU tensors
        through pinned memory without waiting for the GPU (a plain copy from pageable
        memory synchronises the stream: a host sync per micro-batch); the source tensors
        must not be modified afterwards (the update's micro-batches are fresh copies)."""
        if non_blocking and torch.device(device).type == "cuda":
            return self._map(
                lambda v: (v.pin_memory() if v.device.type == "cpu" else v).to(
                    device, non_blocking=True
                )
            )
        return self._map(lambda v: v.to(device))
