"""The memory a run plans with, and the micro-batch ``auto`` picks in it."""

from __future__ import annotations

import logging

import torch

from danka import distributed as dist
from danka.config.schema import DankaConfig
from danka.config.units import GIB, parse_memory
from danka.errors import UserError
from danka.planning.memory import with_settings
from danka.planning.micro import plan_micro_batch


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
            f"speed.gpu_memory {size} is more than this GPU's {total / GIB:.1f} GiB",
            where="speed.gpu_memory",
            fix=f"set at most {total / GIB:.0f}GiB, or remove it (the GPU's free memory)",
        )
    torch.cuda.set_per_process_memory_fraction(budget / total, device)
    log.info(f"speed.gpu_memory: this process is capped at {size} of {total / GIB:.1f} GiB")
    return min(budget, free)


def micro_batch(
    cfg: DankaConfig, budget: int | None, *, engine: str = "hf", base_dir=None, log=None
) -> int:
    """``trainer.micro_batch_size``, or for ``auto`` the largest size the memory plan fits
    in ``budget`` with ``engine`` (danka.planning.micro; None: a CPU run); exit 2 when one
    sequence does not fit."""
    if cfg.trainer.micro_batch_size != "auto":
        return cfg.trainer.micro_batch_size
    with_engine = with_settings(cfg, {"rollout.engine": engine})
    plan = plan_micro_batch(with_engine, budget, world_size=dist.world_size(), base_dir=base_dir)
    if not plan.fits:
        raise plan.refusal()
    if log is not None:
        log.info(f"trainer.micro_batch_size: auto -> {plan.line()}")
    return plan.size
