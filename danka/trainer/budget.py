"""The memory a run plans with, and the micro-batch ``auto`` picks in it."""

from __future__ import annotations

import logging

import torch

from danka import distributed as dist
from danka.config.schema import DankaConfig
from danka.config.units import GIB, parse_memory
from danka.errors import UserError
from danka.planning.memory import (
    MARGIN,
    OVERHEAD_BYTES,
    estimate_memory,
    load_model_config,
    with_settings,
)
from danka.planning.micro import MicroPlan, candidates, plan_micro_batch


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
    cap_process(budget, device)
    log.info(f"speed.gpu_memory: this process is capped at {size} of {total / GIB:.1f} GiB")
    return min(budget, free)


def cap_process(budget: int, device: torch.device) -> int:
    """Cap this process to ``budget`` bytes of ``device`` (what a smaller card would hold);
    the card's total bytes. ``device`` may be a bare ``cuda`` (the current GPU)."""
    index = torch.cuda.current_device() if device.index is None else device.index
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), index)
    return total


def planned_sizes(
    cfg: DankaConfig, budget: int | None, *, engine: str = "hf", base_dir=None, log=None
) -> MicroPlan:
    """The run's micro-batch, and the sizes of ``rollout.generation_batch_size`` and
    ``speed.logprob_chunk_size`` where they are ``auto``: the largest the memory plan fits
    in ``budget`` with ``engine`` (danka.planning.micro; None: a CPU run, the defaults);
    exit 2 when the smallest do not fit. An explicit micro-batch the plan cannot fit is
    refused (:func:`check_fits`)."""
    with_engine = with_settings(cfg, {"rollout.engine": engine})
    tries = candidates(cfg)
    if not tries:
        if budget is not None:
            check_fits(with_engine, budget, base_dir=base_dir)
        return MicroPlan(cfg.trainer.micro_batch_size)
    try:
        plan = plan_micro_batch(with_engine, budget, world_size=dist.world_size(),
                                base_dir=base_dir)  # fmt: skip
    except (UserError, OSError, ValueError):
        if budget is None or set(tries) != {"speed.logprob_chunk_size"}:
            raise
        # only the head's chunk is auto and the model's config cannot be read before it
        # loads: the default chunk (nothing the run asked for needs the plan)
        return plan_micro_batch(with_engine, None)
    if not plan.fits:
        if "trainer.micro_batch_size" in tries:
            raise plan.refusal()
        # an explicit micro-batch: refused only past the plan's margin (check_fits)
        check_fits(with_settings(with_engine, dict(plan.planned)), budget, base_dir=base_dir)
    if log is not None:
        auto = [k for k, _ in plan.planned]
        log.info(f"{', '.join(auto)}: auto -> {plan.line()}")
    return plan


def check_fits(cfg: DankaConfig, budget: int, *, base_dir=None) -> None:
    """Refuse (exit 2, at start-up) an explicit ``trainer.micro_batch_size`` whose plan
    exceeds ``budget`` by more than the plan's margin of error (danka.planning.memory.
    MARGIN: a plan a little over is left to the out-of-memory retries), naming the
    planned peak, the size ``auto`` would pick and the single settings that would fit.
    Not checked (nothing the plan models): torchrun (sharded), tool/environment
    rollouts, and a model whose config cannot be read before loading it."""
    if dist.world_size() > 1 or cfg.rollout.tools or cfg.rollout.environment:
        return
    try:
        config = load_model_config(cfg.model.actor_model_name_or_path, base_dir)
        plan = estimate_memory(cfg, gpu_memory=budget, model_config=config)
    except (UserError, OSError, ValueError):
        return
    need = plan["peak"] + OVERHEAD_BYTES
    if need <= budget * (1 + MARGIN):
        return
    auto = plan_micro_batch(with_settings(cfg, {"trainer.micro_batch_size": "auto"}), budget,
                            model_config=config)  # fmt: skip
    fixes = [f"trainer.micro_batch_size: auto ({auto.line()})"] if auto.fits else []
    fixes += [s for s in plan["suggestions"] if not s.startswith("trainer.micro_batch_size=")]
    raise UserError(
        f"trainer.micro_batch_size {cfg.trainer.micro_batch_size} does not fit: the plan "
        f"peaks at {need / GIB:.1f} GiB (in the {plan['peak_phase']}, with "
        f"{OVERHEAD_BYTES / GIB:.0f} GiB for the CUDA context) of {budget / GIB:.1f} GiB",
        where="trainer.micro_batch_size",
        fix="; ".join(fixes or ["use a smaller model or a larger GPU"])
        + " (danka estimate CONFIG shows the whole plan)",
    )
