"""Typed data that crosses package boundaries. Shapes: B = samples in a step, P = prompt
length (left-padded), R = response length (right-padded)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclass
class PromptRow:
    """One training or evaluation prompt, whatever file format it came from."""

    index: int  # row index in its source file (0-based), for error messages and data order
    prompt: str | list[dict[str, str]]  # plain text, or chat messages [{"role", "content"}]
    ground_truth: str | None = None  # reference answer for rule rewards (None if unknown)
    data_source: str = "unknown"  # verl's data_source, picks a default rule reward
    extra: dict[str, Any] = field(default_factory=dict)  # other columns, passed to rewards


def map_tensors(obj: T, fn) -> T:
    """A copy of the dataclass ``obj`` with ``fn`` applied to every tensor field and to the
    tensors of every dict field; other fields (None, markers, numbers) are kept as they are."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor):
            value = fn(value)
        elif isinstance(value, dict):
            value = {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
        out[f.name] = value
    return type(obj)(**out)


def to_device(obj: T, device: torch.device | str, non_blocking: bool = False) -> T:
    """``obj`` (a dataclass of tensors) on ``device``. ``non_blocking`` to a CUDA device copies
    CPU tensors through pinned memory without waiting for the GPU (a plain copy from pageable
    memory synchronises the stream: a host sync per micro-batch); the source tensors must not
    be modified afterwards (the update's micro-batches are fresh copies)."""
    if non_blocking and torch.device(device).type == "cuda":
        return map_tensors(
            obj,
            lambda v: (v.pin_memory() if v.device.type == "cpu" else v).to(
                device, non_blocking=True
            ),
        )
    return map_tensors(obj, lambda v: v.to(device))


@dataclass
class RolloutBatch:
    """What a rollout engine (or the agent loop) returns: token ids and masks, nothing a
    later stage computes. Scores, log-probs and advantages travel on the trainer's own
    typed records (danka/step/records.py).

    Masks: ``response_mask`` says which response tokens EXIST (generated, up to and
    including EOS); ``loss_mask`` says which of them the loss may train on (equal for a
    single-turn rollout; an agentic rollout zeroes tool-output tokens in it). Whole samples
    are switched off later by a validity flag, never by zeroing a mask.
    """

    prompt_ids: torch.Tensor  # (B, P) long, left-padded with the pad id
    prompt_mask: torch.Tensor  # (B, P) long, 1 on real prompt tokens
    response_ids: torch.Tensor  # (B, R) long, right-padded with the pad id
    response_mask: torch.Tensor  # (B, R) float, 1 on generated tokens up to and incl. EOS
    group_index: torch.Tensor  # (B,) long, which prompt of the step the sample answers
    truncated: torch.Tensor  # (B,) bool, hit max_new_tokens before EOS
    rollout_logprobs: torch.Tensor | None = None  # (B, R) log-probs reported by the engine
    loss_mask: torch.Tensor | None = None  # (B, R) float, tokens the loss trains on
    prompt_index: torch.Tensor | None = None  # (B,) long, row of the prompt set answered

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.response_mask.clone()
        if self.prompt_index is None:
            self.prompt_index = self.group_index.clone()

    @property
    def size(self) -> int:
        return int(self.prompt_ids.shape[0])

    def select(self, idx: torch.Tensor) -> RolloutBatch:
        """Rows ``idx`` of every tensor field."""
        return map_tensors(self, lambda v: v[idx])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RolloutBatch:
        return to_device(self, device, non_blocking)
