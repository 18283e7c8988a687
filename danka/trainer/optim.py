"""Optimiser and learning-rate schedule."""

from __future__ import annotations

import math

import torch


def build_optimizer(params: list[torch.nn.Parameter], *, lr: float, weight_decay: float):
    params = [p for p in params if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **adamw_kernel(params))


def adamw_kernel(params: list[torch.nn.Parameter]) -> dict[str, bool]:
    """Which AdamW implementation: fused on CUDA; the per-tensor one when the list mixes
    FSDP2-sharded (DTensor) and whole (plain) parameters — under torchrun danka shards the
    decoder layers and keeps the embeddings, final norm, lm_head and value head whole, and
    torch's fused and foreach kernels refuse such a mix ("got mixed torch.Tensor and
    DTensor", found on 2 x H200). One param group stays, so a checkpoint's optimiser state
    keeps the single-process layout (resumable with another number of processes)."""
    from torch.distributed.tensor import DTensor

    if len({isinstance(p, DTensor) for p in params}) > 1:
        return {"foreach": False, "fused": False}
    return {"fused": True} if params and params[0].is_cuda else {}


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
