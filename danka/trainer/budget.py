"""The memory a run plans with, and the micro-batch ``auto`` picks in it."""

from __future__ import annotations

import copy
import logging

import torch

from danka import distributed as dist
from danka.config.schema import DankaConfig
from danka.config.units import parse_memory
from danka.errors import UserError
from danka.planning.micro import with_planned


def memory_budget(cfg: DankaConfig, device: torch.device, log: logging.Logger) -> int | None:
    """The bytes a run plans with: ``speed.gpu_memory`` (this process capped to it with
    ``torch.cuda.set_per_process_memory_fraction``: a smaller card on a larger one), else
    the GPU's free memory; None on a CPU (refused there: the setting would not act)."""
    size = cfg.speed.gpu_memory
    if device.type != "cuda":
        if size is not None:
            raise UserError(
                f"speed.gpu_memory plans a GPU's memory; this run is on {device.type}",
                where="speed.gpu_memory",
                fix="remove speed.gpu_memory, or run on a GPU",
            )
        return None
    free, total = torch.cuda.mem_get_info(device)
    if size is None:
        return free
    budget = parse_memory(size, where="speed.gpu_memory")
    if budget > total:
        raise UserError(
            f"speed.gpu_memory {size} is more than this GPU's {total / 2**30:.1f} GiB",
            where="speed.gpu_memory",
            fix=f"set at most {total / 2**30:.0f}GiB, or remove it (the GPU's free memory)",
        )
    torch.cuda.set_per_process_memory_fraction(budget / total, device)
    log.info(f"speed.gpu_memory: this process is capped at {size} of {total / 2**30:.1f} GiB")
    return min(budget, free)


def micro_batch(cfg: DankaConfig, base_dir, engine: str, budget: int | None, log) -> int:
    """``trainer.micro_batch_size``, or for ``auto`` the largest size the memory plan fits
    in ``budget`` with ``engine`` (danka.planning.micro); exit 2 when one sequence does not
    fit."""
    if cfg.trainer.micro_batch_size != "auto":
        return cfg.trainer.micro_batch_size
    c = copy.deepcopy(cfg)
    c.rollout.engine = engine
    _, plan = with_planned(c, budget, world_size=dist.world_size(), base_dir=base_dir)
    assert plan is not None
    if not plan.fits:
        raise plan.refusal()
    if log is not None:
        log.info(f"trainer.micro_batch_size: auto -> {plan.line()}")
    return plan.size
