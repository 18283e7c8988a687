"""Optimiser and learning-rate schedule."""

from __future__ import annotations

import math

import torch


def build_optimizer(params: list[torch.nn.Parameter], *, lr: float, weight_decay: float):
    params = [p for p in params if p.requires_grad]
    fused = bool(params) and params[0].is_cuda
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def build_scheduler(optimizer, *, kind: str, warmup_steps: int, total_steps: int):
    """Linear warm-up, then constant, cosine or linear decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
