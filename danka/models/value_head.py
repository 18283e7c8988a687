"""Scalar value head for the PPO critic: V(s_t) = w . h_t + b, kept in float32.

The critic is the base model with its own LoRA adapter (see ``lora.add_adapter``) plus this
head on the last hidden state, as in Ouyang et al. 2022 / Stiennon et al. 2020.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from danka.errors import UserError

FILENAME = "value_head.safetensors"


class ValueHead(nn.Module):
    """``(..., H)`` hidden states -> ``(..., 1)`` float32 values (squeeze the last dim)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.linear = nn.Linear(hidden_size, 1, dtype=torch.float32)
        # zero, not small random: a fresh head predicting V = c != 0 gives the last token
        # the advantage delta_T = r_T - c (GAE); under rewards ~0 the end-of-turn token is
        # then pushed down every step and answers grow to the token cap.
        # With V = 0 the first advantages come from the rewards alone.
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.to(torch.float32))


def save_value_head(head: ValueHead, directory: str | Path) -> Path:
    """Write ``<directory>/value_head.safetensors``; returns the file path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILENAME
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(path), metadata={"hidden_size": str(head.hidden_size)})
    return path


def load_value_head(directory: str | Path, hidden_size: int | None = None) -> ValueHead:
    """Read a head written by :func:`save_value_head` (UserError if missing or mis-shaped).

    ``hidden_size`` None takes it from the file.
    """
    path = Path(directory) / FILENAME
    if not path.is_file():
        raise UserError(
            f"no value head at {path}",
            fix="resume from a checkpoint written by a PPO run (it saves value_head.safetensors)",
        )
    tensors = load_file(str(path))
    weight = tensors.get("linear.weight")
    if hidden_size is None and weight is not None:
        hidden_size = int(weight.shape[-1])
    if weight is None or tuple(weight.shape) != (1, hidden_size):
        shape = None if weight is None else tuple(weight.shape)
        raise UserError(
            f"value head weight has shape {shape}, expected (1, {hidden_size})",
            where=str(path),
            fix="resume with the same critic model the checkpoint was trained with",
        )
    head = ValueHead(hidden_size)
    head.load_state_dict(tensors)
    return head
