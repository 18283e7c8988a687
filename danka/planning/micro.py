"""``trainer.micro_batch_size: auto``: the largest micro-batch the memory plan fits.

One planner for ``danka estimate`` and the trainer: :func:`danka.planning.memory.
estimate_memory` prices every phase at each candidate size, and the largest size that
divides a mini-batch and keeps the peak (plus the CUDA context and fragmentation reserve)
inside the budget wins. The budget is the GPU's free memory at start-up, or the size a
user names (``speed.gpu_memory``, to plan for a smaller card than the one at hand). On a
CPU there is no device memory to plan: ``auto`` takes the schema's former default, 8 (or
the largest divisor of a mini-batch below it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danka.config.schema import DankaConfig
from danka.errors import UserError
from danka.planning.memory import (
    GIB,
    OVERHEAD_BYTES,
    estimate_memory,
    load_model_config,
    samples_per_prompt_of,
    with_settings,
)

CPU_MICRO_BATCH = 8  # the size every config had before ``auto`` (no memory model for RAM)


@dataclass(frozen=True)
class MicroPlan:
    size: int  # sequences per forward/backward on this rank
    peak: int | None = None  # planned peak in bytes (None: not planned, a CPU run)
    budget: int | None = None  # bytes planned against
    phase: str = ""  # the phase that peaks
    fits: bool = True
    suggestions: tuple[str, ...] = ()  # when nothing fits: settings that would

    def line(self) -> str:
        """The start-up line: "micro-batch 4 (auto: planned 21.3 of 24.0 GiB, peak in the
        update)"."""
        if self.peak is None or self.budget is None:
            return f"micro-batch {self.size} (auto: a CPU run, no memory plan)"
        return (
            f"micro-batch {self.size} (auto: planned {(self.peak + OVERHEAD_BYTES) / GIB:.1f} of "
            f"{self.budget / GIB:.1f} GiB, peak in the {self.phase})"
        )

    def refusal(self) -> UserError:
        """Exit 2 at start-up: one sequence per forward does not fit the budget."""
        assert self.peak is not None and self.budget is not None
        fixes = "; ".join(self.suggestions or ("use a smaller model or a larger GPU",))
        return UserError(
            f"nothing fits in {self.budget / GIB:.1f} GiB: at micro-batch 1 the plan peaks at "
            f"{(self.peak + OVERHEAD_BYTES) / GIB:.1f} GiB (in the {self.phase}, with "
            f"{OVERHEAD_BYTES / GIB:.0f} GiB for the CUDA context)",
            where="trainer.micro_batch_size",
            fix=f"{fixes} (danka estimate CONFIG shows the whole plan)",
        )


def mini_batch_sequences(cfg: DankaConfig, world_size: int = 1) -> int:
    """Sequences per optimiser step on one rank: what a micro-batch size must divide."""
    t = cfg.trainer
    n = samples_per_prompt_of(cfg)
    return max(1, (t.mini_batch_size or t.batch_size) * n // world_size)


def plan_micro_batch(
    cfg: DankaConfig,
    budget: int | None,
    *,
    world_size: int = 1,
    base_dir: Path | None = None,
    model_config: Any = None,
) -> MicroPlan:
    """The micro-batch for ``cfg`` (whose ``trainer.micro_batch_size`` is ``auto``) under
    ``budget`` bytes of GPU memory (None: a CPU run): the largest divisor of a mini-batch
    whose plan fits; size 1 with ``fits`` False (and the settings that would fit) when
    none does."""
    seqs = mini_batch_sequences(cfg, world_size)
    sizes = [d for d in range(seqs, 0, -1) if seqs % d == 0]
    if budget is None:
        return MicroPlan(next(d for d in sizes if d <= CPU_MICRO_BATCH))
    config = model_config or load_model_config(cfg.model.actor_model_name_or_path, base_dir)
    for size in sizes:
        trial = with_settings(cfg, {"trainer.micro_batch_size": size})
        plan = estimate_memory(trial, gpu_memory=budget, model_config=config)
        if plan["fits"]:
            return MicroPlan(size, plan["peak"], budget, plan["peak_phase"])
    return MicroPlan(1, plan["peak"], budget, plan["peak_phase"], False, tuple(plan["suggestions"]))


def with_planned(
    cfg: DankaConfig,
    budget: int | None,
    *,
    model_config: Any = None,
    world_size: int = 1,
    base_dir: Path | None = None,
) -> tuple[DankaConfig, MicroPlan | None]:
    """``cfg`` itself with a numeric micro-batch, else a copy with the planned one (and
    the plan): what every caller of ``estimate_memory`` prices."""
    if cfg.trainer.micro_batch_size != "auto":
        return cfg, None
    plan = plan_micro_batch(
        cfg, budget, model_config=model_config, world_size=world_size, base_dir=base_dir
    )
    return with_settings(cfg, {"trainer.micro_batch_size": plan.size}), plan
