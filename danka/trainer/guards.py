"""Out-of-memory: caught per phase and explained with the sizes and the settings to change."""

from __future__ import annotations

import contextlib

import torch

from danka.errors import UserError

FIXES = {
    "rollout": "lower trainer.batch_size or trainer.samples_per_prompt, trainer.max_new_tokens, "
    "or set rollout.generation_batch_size (sequences per generate call)",
    "log-probs": "lower trainer.micro_batch_size or trainer.logprob_chunk_size",
    "update": "lower trainer.micro_batch_size (or set trainer.auto_micro_batch: true), set "
    "model.use_gradient_checkpointing: true, lower trainer.max_length, or keep "
    "lora.enable_lora: true",
}


class TrainingFault(UserError):
    """A fault during training (not bad input): printed without a traceback, exit code 3."""

    exit_code = 3


class OutOfMemory(TrainingFault):
    """The device ran out of memory in a named phase."""


def _oom_types() -> tuple[type[BaseException], ...]:
    return tuple(
        t
        for t in (
            getattr(torch, "OutOfMemoryError", None),
            getattr(torch.cuda, "OutOfMemoryError", None),
        )
        if t is not None
    )


def explain_oom(phase: str, run, err: BaseException) -> OutOfMemory:
    t = run.cfg.trainer
    sizes = (
        f"{t.batch_size} prompts x {t.samples_per_prompt} samples, micro-batch "
        f"{run.state.micro_batch_size}, max_length {t.max_length}, max_new_tokens {t.max_new_tokens}"
    )
    mem = ""
    if run.device.type == "cuda":
        mem = (
            f"; peak {torch.cuda.max_memory_allocated(run.device) / 2**30:.1f} GiB of "
            f"{torch.cuda.get_device_properties(run.device).total_memory / 2**30:.1f} GiB"
        )
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return OutOfMemory(
        f"out of memory during {phase} ({sizes}{mem}): {first}",
        where=f"phase {phase}",
        fix=FIXES.get(phase, FIXES["update"]),
    )


@contextlib.contextmanager
def oom_guard(phase: str, run):
    try:
        yield
    except _oom_types() as err:
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
        raise explain_oom(phase, run, err) from None
