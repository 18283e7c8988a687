"""Out-of-memory: caught per phase and explained with the sizes and the settings to change."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from danka.errors import UserError

# keyed by the step's phases (danka.step.train_step.PHASES)
_PREPARE_FIX = (
    "lower speed.logprob_chunk_size or trainer.micro_batch_size "
    "(speed.auto_micro_batch, on by default, halves it down to 1)"
)
FIXES = {
    "rollout": "lower trainer.batch_size or trainer.samples_per_prompt, trainer.max_new_tokens, "
    "or set rollout.generation_batch_size (sequences per generate call)",
    "logprobs": _PREPARE_FIX,
    "values": _PREPARE_FIX,
    "update": "lower trainer.micro_batch_size (speed.auto_micro_batch, on by default, halves "
    "it down to 1), set model.use_gradient_checkpointing: true, lower trainer.max_length, "
    "or keep lora.enable_lora: true",
}


class TrainingFault(UserError):
    """A fault during training (not bad input): printed without a traceback, exit code 3."""

    exit_code = 3


class OutOfMemory(TrainingFault):
    """The device ran out of memory in a named phase."""


class DoesNotFit(OutOfMemory):
    """Out of memory at the smallest size the halving retries reach: the settings do not
    fit this card (bad input, exit 2), not a passing fault."""

    exit_code = 2

    @classmethod
    def because(cls, err: OutOfMemory, context: str) -> DoesNotFit:
        """``err`` as a verdict on the settings; ``context``: when it happened."""
        return cls(
            f"{err.what}; {context}",
            where=err.where,
            fix=f"{err.fix}; danka estimate CONFIG --gpu-memory SIZE prints the plan per phase",
        )


def _oom_types() -> tuple[type[BaseException], ...]:
    return tuple(
        t
        for t in (
            getattr(torch, "OutOfMemoryError", None),
            getattr(torch.cuda, "OutOfMemoryError", None),
        )
        if t is not None
    )


@dataclass(frozen=True)
class Sizes:
    """The step's sizes an out-of-memory message names (with the micro-batch it ran at)."""

    batch_size: int
    samples_per_prompt: int
    max_length: int
    max_new_tokens: int

    def at(self, micro: int) -> str:
        """The sizes at micro-batch ``micro``, as the message shows them."""
        return (
            f"{self.batch_size} prompts x {self.samples_per_prompt} samples, micro-batch "
            f"{micro}, max_length {self.max_length}, max_new_tokens {self.max_new_tokens}"
        )


def explain_oom(phase: str, sizes: str, device: torch.device, err: BaseException):
    mem = ""
    if device.type == "cuda":
        mem = (
            f"; peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB of "
            f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB"
        )
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return OutOfMemory(
        f"out of memory during {phase} ({sizes}{mem}): {first}",
        where=f"phase {phase}",
        fix=FIXES.get(phase, FIXES["update"]),
    )


@contextlib.contextmanager
def oom_guard(phase: str, sizes: str, device: torch.device):
    """A device out-of-memory in the block becomes :class:`OutOfMemory` naming the phase,
    the sizes and the settings to change."""
    try:
        yield
    except _oom_types() as err:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise explain_oom(phase, sizes, device, err) from None
