"""A run's whole start-up plan in one call, made before the models load: the memory it
plans with, the model's shape, the rollout engine and why, the sizes ``auto`` picks, and
an engine's own memory share (vLLM). ``danka train`` makes it once (trainer.build) and
builds from it; nothing is priced twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from danka.errors import UserError
from danka.planning.engine import choose_engine
from danka.planning.inputs import PlanInput
from danka.planning.micro import SizePlan, candidates, check_fits, plan_memory
from danka.planning.shape import ModelShape, load_model_config, model_config_or_none
from danka.planning.vllm import engine_memory
from danka.rollout.base import engine_meta
from danka.schema.sections import DankaConfig
from danka.schema.units import GIB, parse_memory


@dataclass(frozen=True)
class RunPlan:
    """What a run is built with (each field logged at start-up)."""

    budget: int | None  # bytes the plan may use (None: a CPU run, nothing is planned)
    shape: ModelShape | None  # the actor's shape (None: not readable before it loads)
    engine: str  # the rollout engine: "hf", "fast" or "vllm"
    engine_why: str  # why that engine
    sizes: SizePlan  # micro-batch, generation batch, log-prob chunk (auto ones planned)
    engine_memory: dict = field(default_factory=dict)  # vLLM's planned share, else {}


def plan_run(
    cfg: DankaConfig,
    device: torch.device,
    *,
    prompt_tokens: int | None,
    log: logging.Logger,
    base_dir=None,
    world_size: int = 1,
    check: Callable[[str], None] | None = None,
) -> RunPlan:
    """The plan of a run of ``cfg`` on ``device`` whose longest training prompt encodes to
    ``prompt_tokens`` (None: the config's bound is priced). ``check(engine)`` runs as soon
    as the engine is chosen, before anything is sized (the trainer's refusals of settings
    that engine ignores). Exit 2 when the smallest sizes do not fit."""
    budget = memory_budget(cfg, device, log)
    shape = model_shape(cfg, base_dir) if budget is not None else None  # read once
    name, why = choose_engine(
        cfg, device, free_bytes=budget, shape=shape, prompt_tokens=prompt_tokens
    )
    if check is not None:
        check(name)
    sizes = planned_sizes(
        cfg,
        budget,
        engine=name,
        shape=shape,
        base_dir=base_dir,
        log=log,
        prompt_tokens=prompt_tokens,
        world_size=world_size,
    )
    own = {}
    if engine_meta(name).own_memory:
        shape = shape or model_shape(cfg, base_dir)  # not read when nothing was budgeted
        if shape is not None:
            own = engine_memory(cfg, sizes.sizes, shape, device)
    return RunPlan(budget, shape, name, why, sizes, own)


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


def model_shape(cfg: DankaConfig, base_dir=None) -> ModelShape | None:
    """The actor's shape for the plan, read once before the model loads; None where its
    config cannot be read yet (a plan that needs it then says why: :func:`planned_sizes`)."""
    config = model_config_or_none(cfg.model.actor_model_name_or_path, base_dir)
    if config is None:
        return None
    try:
        return ModelShape.of(config, cfg.lora.target_modules, cfg.lora.lora_r)
    except (OSError, ValueError):  # an architecture transformers cannot build on meta
        return None


def planned_sizes(
    cfg: DankaConfig,
    budget: int | None,
    *,
    engine: str = "hf",
    shape: ModelShape | None = None,
    base_dir=None,
    log=None,
    prompt_tokens: int | None = None,
    world_size: int = 1,
) -> SizePlan:
    """The run's micro-batch, and the sizes of ``rollout.generation_batch_size`` and
    ``speed.logprob_chunk_size`` where they are ``auto``: the largest the memory plan fits
    in ``budget`` with ``engine`` for a model of ``shape`` (danka.planning.micro; budget
    None: a CPU run, the defaults); exit 2 when the smallest do not fit. An explicit
    micro-batch the plan cannot fit is refused (danka.planning.micro.check_fits).
    ``prompt_tokens``: the longest training prompt as encoded (the plan prices it plus
    ``max_new_tokens``; None: the config's bound)."""
    inp = PlanInput.of(cfg, prompt_tokens).with_(engine=engine)
    auto = set(candidates(inp))
    if budget is not None and shape is None and auto - {"logprob_chunk_size"}:
        config = load_model_config(inp.model, base_dir)  # the plan needs the model: why it
        shape = ModelShape.of(config, inp.target_modules, inp.lora_r)  # cannot be read/built
    if budget is not None and shape is None:
        # nothing the run asked for needs the model: the sizes as written, the default
        # chunk where it is auto (the vocabulary is read when the model loads)
        return plan_memory(inp, None, None)
    if budget is None:  # a CPU run: the defaults
        plan = plan_memory(inp, None, None, world_size=world_size)
    else:
        plan = plan_memory(inp, shape, budget, world_size=world_size)
        if not plan.fits and "micro_batch_size" in auto:
            raise plan.refusal()
        if not plan.fits:
            check_fits(plan, shape, world_size=world_size)  # refused only past the plan's margin
    if log is not None and auto:
        log.info(f"{', '.join(k for k, _ in plan.planned)}: auto -> {plan.line()}")
    return plan
