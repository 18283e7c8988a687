"""The sizes ``auto`` stands for: ``trainer.micro_batch_size``, ``rollout.
generation_batch_size`` (sequences per generate call, and so the rollout's KV cache) and
``speed.logprob_chunk_size``, the largest the memory plan fits.

One planner for ``danka estimate``, the engine choice and the trainer, called once:
:func:`plan_memory` prices every phase at each candidate (:func:`danka.planning.memory.
price`), and the first that keeps the peak (plus the CUDA
context and fragmentation reserve) inside the budget wins, in this order: the largest
generation batch (whole groups of ``samples_per_prompt``, halving from all at once: the
rollout is most of a step), then the largest micro-batch that divides a mini-batch, then
the largest log-prob chunk among 1024, 512, 256, 128 whose fp32 logits take at most
``CHUNK_TARGET_BYTES`` (the head's transient sized to the work, not to the card: 1024 rows
for a 152k vocabulary, 512 for 256k). A size the user wrote stays as written. The
budget is the GPU's free memory at start-up, or the size a user names
(``speed.gpu_memory``, to plan for a smaller card than the one at hand). On a CPU there
is no device memory to plan: ``auto`` takes the schema's former defaults (micro-batch 8,
or the largest divisor of a mini-batch below it; all sequences at once; chunk 1024).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from danka.errors import UserError
from danka.planning.inputs import KEYS, PlanInput
from danka.planning.memory import (
    GIB,
    MARGIN,
    OVERHEAD_BYTES,
    chunk_candidates,
    fixes,
    price,
)
from danka.planning.shape import ModelShape

CPU_MICRO_BATCH = 8  # the size every config had before ``auto`` (no memory model for RAM)
CPU_CHUNK = 1024  # the schema's former default of speed.logprob_chunk_size


@dataclass(frozen=True)
class SizePlan:
    """The sizes a run uses (``auto`` resolved) and, on a GPU, how they were priced."""

    sizes: PlanInput  # every size a number: the plan's input with the chosen values
    auto: tuple[str, ...] = ()  # the fields that were auto (PlanInput names), in try order
    peak: int | None = None  # planned peak in bytes (None: not planned, a CPU run)
    budget: int | None = None  # bytes planned against
    phase: str = ""  # the phase that peaks
    fits: bool = True
    suggestions: tuple[str, ...] = ()  # when nothing fits: settings that would

    @property
    def micro(self) -> int:
        """Sequences per forward/backward on this rank."""
        return self.sizes.micro_batch_size

    @property
    def generation_batch(self) -> int:
        """Sequences per generate call (0 = all of a step's)."""
        return self.sizes.generation_batch_size

    @property
    def logprob_chunk(self) -> int:
        return self.sizes.logprob_chunk_size

    @property
    def planned(self) -> tuple[tuple[str, int], ...]:
        """The values chosen for the settings that were auto: ``(config key, value)``."""
        return tuple((KEYS[name], getattr(self.sizes, name)) for name in self.auto)

    def line(self) -> str:
        """The start-up line: "micro-batch 4 (auto: planned 21.3 of 24.0 GiB, peak in the
        update)", with the other planned sizes after the micro-batch."""
        sizes = [f"micro-batch {self.micro}"] + [
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
            f"nothing fits in {self.budget / GIB:.1f} GiB: at micro-batch {self.micro} the "
            f"plan peaks at {(self.peak + OVERHEAD_BYTES) / GIB:.1f} GiB (in the {self.phase}, "
            f"with {OVERHEAD_BYTES / GIB:.0f} GiB for the CUDA context)",
            where="trainer.micro_batch_size",
            fix=f"{fixes} (danka estimate CONFIG shows the whole plan)",
        )


LABELS = {
    "rollout.generation_batch_size": "generation batch",
    "speed.logprob_chunk_size": "log-prob chunk",
}


def candidates(
    inp: PlanInput, world_size: int = 1, gpu: bool = True, vocab: int | None = None
) -> dict[str, list[int]]:
    """Each auto setting's values to try, best first (one value on a CPU: its default),
    by PlanInput field; ``vocab``: the model's, for the log-prob chunks
    (:func:`chunk_candidates`)."""
    from danka.rollout.base import halve_groups  # the engines' own halving (whole groups)

    out: dict[str, list[int]] = {}
    if inp.generation_batch_size == "auto":
        n = inp.samples_per_prompt
        gens = [inp.batch_size * n]
        while gpu and (fewer := halve_groups(gens[-1], n)) is not None:
            gens.append(fewer)
        out["generation_batch_size"] = gens
    if inp.micro_batch_size == "auto":
        seqs = inp.mini_batch_sequences(world_size)
        divisors = [d for d in range(seqs, 0, -1) if seqs % d == 0]
        out["micro_batch_size"] = (
            divisors if gpu else [next(d for d in divisors if d <= CPU_MICRO_BATCH)]
        )
    if inp.logprob_chunk_size == "auto":
        out["logprob_chunk_size"] = chunk_candidates(vocab) if gpu else [CPU_CHUNK]
    return out


def plan_memory(
    inp: PlanInput, shape: ModelShape | None, budget: int | None, *, world_size: int = 1
) -> SizePlan:
    """The sizes of ``inp`` that are ``auto`` (module docstring) under ``budget`` bytes of
    GPU memory for a model of ``shape`` (budget None: a CPU run, the defaults; a size
    written as a number stays); the smallest of each with ``fits`` False (and the settings
    that would fit) when nothing does. With a budget and nothing auto, the sizes as
    written are priced."""
    tries = candidates(inp, world_size, gpu=budget is not None, vocab=shape and shape.V)
    auto = tuple(tries)
    combos = [dict(zip(auto, values, strict=True)) for values in itertools.product(*tries.values())]
    if budget is None or shape is None:
        return SizePlan(inp.with_(**combos[0]), auto)
    for changes in combos:
        trial = inp.with_(**changes)
        priced = price(trial, shape)
        if priced.need <= budget:
            return SizePlan(trial, auto, priced.peak, budget, priced.peak_phase)
    trial = inp.with_(**combos[-1])
    priced = price(trial, shape)
    return SizePlan(
        trial,
        auto,
        priced.peak,
        budget,
        priced.peak_phase,
        False,
        tuple(fixes(trial, shape, budget)),
    )


def check_fits(plan: SizePlan, shape: ModelShape, *, world_size: int = 1) -> None:
    """Refuse (exit 2, at start-up) an explicit ``trainer.micro_batch_size`` whose plan
    exceeds the budget by more than the plan's margin of error (MARGIN: a plan a little
    over is left to the out-of-memory retries), naming the planned peak, the size
    ``auto`` would pick and the single settings that would fit. Not checked (nothing the
    plan models): torchrun (sharded) and tool/environment rollouts."""
    inp, budget = plan.sizes, plan.budget
    if budget is None or world_size > 1 or inp.tools:
        return
    priced = price(inp, shape)
    if priced.need <= budget * (1 + MARGIN):
        return
    auto = plan_memory(inp.with_(micro_batch_size="auto"), shape, budget)
    found = [f"trainer.micro_batch_size: auto ({auto.line()})"] if auto.fits else []
    found += [s for s in fixes(inp, shape, budget) if not s.startswith("trainer.micro_batch_size=")]
    raise UserError(
        f"trainer.micro_batch_size {inp.micro_batch_size} does not fit: the plan peaks at "
        f"{priced.need / GIB:.1f} GiB (in the {priced.peak_phase}, with "
        f"{OVERHEAD_BYTES / GIB:.0f} GiB for the CUDA context) of {budget / GIB:.1f} GiB",
        where="trainer.micro_batch_size",
        fix="; ".join(found or ["use a smaller model or a larger GPU"])
        + " (danka estimate CONFIG shows the whole plan)",
    )
