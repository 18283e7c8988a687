"""The sizes ``auto`` stands for: ``trainer.micro_batch_size``, ``rollout.
generation_batch_size`` (sequences per generate call, and so the rollout's KV cache) and
``speed.logprob_chunk_size``, the largest the memory plan fits.

One planner for ``danka estimate`` and the trainer: :func:`danka.planning.memory.pricer`
prices every phase at each candidate, and the first that keeps the peak (plus the CUDA
context and fragmentation reserve) inside the budget wins, in this order: the largest
generation batch (whole groups of ``samples_per_prompt``, halving from all at once: the
rollout is most of a step), then the largest micro-batch that divides a mini-batch, then
the largest log-prob chunk among 1024, 512, 256, 128 whose fp32 logits take at most
``CHUNK_TARGET_BYTES`` (the head's transient sized to the work, not to the card: 256 rows for
a 49k vocabulary, 128 for 152k). A size the user wrote stays as written. The
budget is the GPU's free memory at start-up, or the size a user names
(``speed.gpu_memory``, to plan for a smaller card than the one at hand). On a CPU there
is no device memory to plan: ``auto`` takes the schema's former defaults (micro-batch 8,
or the largest divisor of a mini-batch below it; all sequences at once; chunk 1024).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danka.config.schema import DankaConfig
from danka.errors import UserError
from danka.planning.memory import (
    GIB,
    OVERHEAD_BYTES,
    chunk_candidates,
    estimate_memory,
    load_model_config,
    pricer,
    samples_per_prompt_of,
    vocab_of,
    with_settings,
)

CPU_MICRO_BATCH = 8  # the size every config had before ``auto`` (no memory model for RAM)
CPU_CHUNK = 1024  # the schema's former default of speed.logprob_chunk_size


@dataclass(frozen=True)
class MicroPlan:
    size: int  # sequences per forward/backward on this rank
    peak: int | None = None  # planned peak in bytes (None: not planned, a CPU run)
    budget: int | None = None  # bytes planned against
    phase: str = ""  # the phase that peaks
    fits: bool = True
    suggestions: tuple[str, ...] = ()  # when nothing fits: settings that would
    # the planned values of the settings that were auto ({dotted key: value}), size included
    planned: tuple[tuple[str, int], ...] = ()

    def value_of(self, cfg: DankaConfig, dotted: str) -> int:
        """A size setting's value for the run: as written, else what this plan chose for
        its ``auto``."""
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        return dict(self.planned)[dotted] if value == "auto" else value

    def line(self) -> str:
        """The start-up line: "micro-batch 4 (auto: planned 21.3 of 24.0 GiB, peak in the
        update)", with the other planned sizes after the micro-batch."""
        sizes = [f"micro-batch {self.size}"] + [
            f"{LABELS[key]} {value}" for key, value in self.planned if key in LABELS
        ]
        if self.peak is None or self.budget is None:
            return f"{', '.join(sizes)} (auto: a CPU run, no memory plan)"
        return (
            f"{', '.join(sizes)} (auto: planned {(self.peak + OVERHEAD_BYTES) / GIB:.1f} of "
            f"{self.budget / GIB:.1f} GiB, peak in the {self.phase})"
        )

    def refusal(self) -> UserError:
        """Exit 2 at start-up: the smallest sizes do not fit the budget."""
        assert self.peak is not None and self.budget is not None
        fixes = "; ".join(self.suggestions or ("use a smaller model or a larger GPU",))
        return UserError(
            f"nothing fits in {self.budget / GIB:.1f} GiB: at micro-batch {self.size} the plan "
            f"peaks at {(self.peak + OVERHEAD_BYTES) / GIB:.1f} GiB (in the {self.phase}, with "
            f"{OVERHEAD_BYTES / GIB:.0f} GiB for the CUDA context)",
            where="trainer.micro_batch_size",
            fix=f"{fixes} (danka estimate CONFIG shows the whole plan)",
        )


LABELS = {
    "rollout.generation_batch_size": "generation batch",
    "speed.logprob_chunk_size": "log-prob chunk",
}


def mini_batch_sequences(cfg: DankaConfig, world_size: int = 1) -> int:
    """Sequences per optimiser step on one rank: what a micro-batch size must divide."""
    t = cfg.trainer
    n = samples_per_prompt_of(cfg)
    return max(1, (t.mini_batch_size or t.batch_size) * n // world_size)


def candidates(
    cfg: DankaConfig, world_size: int = 1, gpu: bool = True, vocab: int | None = None
) -> dict[str, list[int]]:
    """Each auto setting's values to try, best first (one value on a CPU: its default);
    ``vocab``: the model's, for the log-prob chunks (:func:`chunk_candidates`)."""
    from danka.rollout.base import halve_groups  # the engines' own halving (whole groups)

    out: dict[str, list[int]] = {}
    if cfg.rollout.generation_batch_size == "auto":
        n = samples_per_prompt_of(cfg)
        every = cfg.trainer.batch_size * n
        gens = [every]
        while gpu and (fewer := halve_groups(gens[-1], n)) is not None:
            gens.append(fewer)
        out["rollout.generation_batch_size"] = gens
    if cfg.trainer.micro_batch_size == "auto":
        seqs = mini_batch_sequences(cfg, world_size)
        divisors = [d for d in range(seqs, 0, -1) if seqs % d == 0]
        out["trainer.micro_batch_size"] = (
            divisors if gpu else [next(d for d in divisors if d <= CPU_MICRO_BATCH)]
        )
    if cfg.speed.logprob_chunk_size == "auto":
        out["speed.logprob_chunk_size"] = chunk_candidates(vocab) if gpu else [CPU_CHUNK]
    return out


def plan_micro_batch(
    cfg: DankaConfig,
    budget: int | None,
    *,
    world_size: int = 1,
    base_dir: Path | None = None,
    model_config: Any = None,
) -> MicroPlan:
    """The sizes for the settings of ``cfg`` that are ``auto`` (module docstring) under
    ``budget`` bytes of GPU memory (None: a CPU run, the defaults); the smallest of each
    with ``fits`` False (and the settings that would fit) when nothing does."""
    config = None
    if budget is not None:
        config = model_config or load_model_config(cfg.model.actor_model_name_or_path, base_dir)
    tries = candidates(cfg, world_size, gpu=budget is not None, vocab=vocab_of(config))
    keys = list(tries)
    micro = cfg.trainer.micro_batch_size

    def plan_for(values: tuple[int, ...]) -> tuple[MicroPlan, DankaConfig]:
        changes = dict(zip(keys, values, strict=True))
        size = changes.get("trainer.micro_batch_size", micro)
        return MicroPlan(size, planned=tuple(changes.items())), with_settings(cfg, changes)

    combos = list(itertools.product(*tries.values()))
    if budget is None:
        return plan_for(combos[0])[0]
    estimate = pricer(cfg, config)
    for values in combos:
        plan, trial = plan_for(values)
        priced = estimate(trial)
        if priced["peak"] + OVERHEAD_BYTES <= budget:
            return MicroPlan(plan.size, priced["peak"], budget, priced["peak_phase"],
                             planned=plan.planned)  # fmt: skip
    plan, trial = plan_for(combos[-1])
    priced = estimate_memory(trial, gpu_memory=budget, model_config=config)
    return MicroPlan(plan.size, priced["peak"], budget, priced["peak_phase"], False,
                     tuple(priced["suggestions"]), plan.planned)  # fmt: skip


def with_planned(
    cfg: DankaConfig,
    budget: int | None,
    *,
    model_config: Any = None,
    world_size: int = 1,
    base_dir: Path | None = None,
) -> tuple[DankaConfig, MicroPlan | None]:
    """``cfg`` itself when no size is ``auto``, else a copy with the planned sizes (and the
    plan): what every caller of ``estimate_memory`` prices."""
    if not candidates(cfg):
        return cfg, None
    plan = plan_micro_batch(
        cfg, budget, model_config=model_config, world_size=world_size, base_dir=base_dir
    )
    return with_settings(cfg, dict(plan.planned)), plan
