"""The fast engine's settings, apart by who sets them, and the one place "auto" is decided.

- :class:`FastOptions`: what a user sets (``rollout.generation_batch_size``,
  ``rollout.keep_cache``, ``rollout.compile``, ``rollout.decode_attention``,
  ``rollout.lora_compute``), with help per field;
- :class:`FastExperiments`: the engine's geometry and A/B switches, which only tests and
  benchmarks change (the defaults are what every run uses);
- :func:`resolve_path`: every ``auto`` / ``None`` of both, for one model on one device,
  into the :class:`FastPath` a call runs (the engine logs it when it changes).

The geometry constants are exported: the memory plan (danka.planning.memory) imports them
instead of copying them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from danka.errors import UserError
from danka.rollout.base import LORA_COMPUTE, keeps_cache

MAX_BATCH = 256  # sequences per decode batch when rollout.generation_batch_size is 0
SEQ_ROUND = 32  # the KV cache length is rounded up to this (graphs re-used across lengths)
PREFILL_BATCH = 32  # prompts per prefill forward
FIRST_STAGE = 64  # staged decode: new tokens every row gets in the first, small cache
LIVE_CHUNK = 64  # decode attention over the live slots rounded up to this (SDPA)
CHECK_EVERY = 16  # decode steps between the host's "all finished?" checks
FUSE_LIMIT_BYTES = 2**30  # engine-owned weight copies (fused or merged) only up to this

DECODE_ATTENTION = ("auto", "sdpa", "triton")


def decode_rows(batch_size: int) -> int:
    """Rows one decode batch holds at most: ``rollout.generation_batch_size``, 0 = ``MAX_BATCH``."""
    return max(1, int(batch_size or MAX_BATCH))


def decode_prompts(batch_size: int, n: int) -> int:
    """Prompts one decode batch takes: whole groups of ``n`` samples within
    :func:`decode_rows`, at least one group (the engine, and the plan pricing its cache)."""
    return max(1, decode_rows(batch_size) // n)


def _help(default, text: str):
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class FastOptions:
    """The fast engine's user-facing options (the ``rollout.*`` keys it honours)."""

    batch_size: int = _help(
        0,
        "sequences per decode batch (rollout.generation_batch_size; prompts are split to "
        f"fit, whole groups at a time); 0 = {MAX_BATCH}",
    )
    keep_cache: bool | None = _help(
        None,
        "keep the KV cache, buffers and CUDA graphs between calls (rollout.keep_cache); "
        "None / False: freed at the end of each call, before the update",
    )
    compile_step: bool = _help(
        False,
        "torch.compile the per-layer decode function (rollout.compile): inductor fuses "
        "the norm/RoPE/residual/activation kernels; the first call compiles",
    )
    attention: str = _help(
        "auto",
        "the decode step's attention kernel (rollout.decode_attention): sdpa (masked "
        "memory-efficient SDPA), triton (split-K FlashDecoding over the live slots, CUDA "
        "only), auto = triton on a CUDA model when triton imports, else sdpa",
    )
    lora_compute: str = _help(
        "auto",
        "a live LoRA adapter's path (rollout.lora_compute): base (the model's dtype, A "
        "folded into the projection's GEMM, B added by one kernel), adapter (the adapter's "
        "own dtype, peft's arithmetic), merge (W + s*B@A merged into engine-owned copies "
        f"at every call; models whose copies fit {FUSE_LIMIT_BYTES // 2**30} GiB only); "
        "auto = base",
    )

    def __post_init__(self) -> None:
        if self.lora_compute not in LORA_COMPUTE:
            raise UserError(
                f"lora_compute={self.lora_compute!r}",
                where="rollout.lora_compute",
                fix='use "auto" (= base), "adapter" (exact fp32 adapter path), "base" (bf16, '
                'fewer kernels) or "merge" (merged bf16 copies, no extra kernel)',
            )
        check_attention(self.attention)

    @property
    def max_batch(self) -> int:
        return decode_rows(self.batch_size)


@dataclass(frozen=True)
class FastExperiments:
    """The engine's geometry and A/B switches (tests and benchmarks; runs keep the
    defaults). ``None``: decided per model by :func:`resolve_path`."""

    use_cuda_graph: bool | None = None  # capture the decode step in CUDA graphs; None: on CUDA
    check_every: int = CHECK_EVERY  # steps between host checks of "all finished"
    prefill_batch: int = PREFILL_BATCH  # prompts per prefill forward
    seq_round: int = SEQ_ROUND  # KV capacity rounded up to this (>= 8)
    # q|k|v and gate|up in one GEMM each from engine-owned copies; None: only when those
    # copies take <= FUSE_LIMIT_BYTES (small models; a 7B reads live)
    fuse_weights: bool | None = None
    live_chunk: int = LIVE_CHUNK  # SDPA decode over live slots rounded to this; 0 = all T
    # Triton attention without compile runs model.decode_layer_fused (~10 launches a
    # layer instead of ~18); None: on there, False: the unfused ops
    fused_step: bool | None = None
    colocate_weights: bool = True  # q/k/v and gate/up stored back to back: views, no copy
    first_stage: int = FIRST_STAGE  # staged cache: prompt + this many tokens first; 0 = off
    # temperature / greedy sampling in one Triton pass (triton_sample) with Triton
    # attention; off until measured on a GPU (the torch ops of sampling.sample_next)
    fused_sampling: bool = False


@dataclass(frozen=True)
class FastPath:
    """What one model on one device runs: every ``auto`` decided."""

    attention: str  # "sdpa" or "triton"
    fused_step: bool  # the fused Triton decode layer
    fused_sampling: bool  # next tokens in one Triton pass (triton_sample)
    fuse_weights: bool  # fused q|k|v and gate|up copies
    cuda_graphs: bool
    keep_cache: bool
    lora_compute: str  # "base", "adapter" or "merge"

    def line(self) -> str:
        """The log line naming the path."""
        parts = [
            f"{self.attention} attention" + (" (fused step)" if self.fused_step else ""),
            "Triton sampling" if self.fused_sampling else "torch sampling",
            "CUDA graphs" if self.cuda_graphs else "eager",
            "fused weight copies" if self.fuse_weights else "live weights",
            f"LoRA {self.lora_compute}",
            "cache kept" if self.keep_cache else "cache freed after each call",
        ]
        return "fast engine: " + ", ".join(parts)


def interpreted() -> bool:
    """Triton's CPU interpreter is on (tests only): the triton kernel may run on the CPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _triton_import_error() -> ImportError | None:
    """Import (and so register) the triton kernel's custom op; the ImportError if triton is
    missing."""
    try:
        import danka.rollout.fast.triton_decode  # noqa: F401
    except ImportError as e:
        return e
    return None


def check_attention(name: str) -> str:
    """``rollout.decode_attention`` validated; ``"triton"`` imports the kernel, or says how
    to get triton."""
    if name not in DECODE_ATTENTION:
        raise UserError(
            f"rollout.decode_attention: {name!r} is not a decode attention kernel",
            where="rollout.decode_attention",
            fix=f"use one of: {', '.join(DECODE_ATTENTION)}",
        )
    if name == "triton" and (e := _triton_import_error()) is not None:
        raise UserError(
            f"rollout.decode_attention: triton needs the triton package ({e})",
            where="rollout.decode_attention",
            fix="pip install triton (CUDA builds of torch ship it), or set "
            "rollout.decode_attention: sdpa",
        ) from e
    return name


def resolve_attention(name: str, device: torch.device) -> str:
    """``auto`` -> ``triton`` for a CUDA model when triton imports, else ``sdpa``."""
    if name != "auto":
        return name
    return "triton" if device.type == "cuda" and _triton_import_error() is None else "sdpa"


def resolve_lora_compute(name: str) -> str:
    """``rollout.lora_compute``: ``auto`` is ``base``."""
    return "base" if name == "auto" else name


def resolve_path(
    options: FastOptions, experiments: FastExperiments, device: torch.device, copy_bytes: int
) -> FastPath:
    """The path the engine runs a model on ``device`` whose fused copies would take
    ``copy_bytes``: every ``auto``/``None`` decided here, and the combinations that cannot
    run refused (UserError naming the setting)."""
    attention = resolve_attention(options.attention, device)
    if attention == "triton" and device.type != "cuda" and not interpreted():
        raise UserError(
            f"rollout.decode_attention: triton runs on a CUDA GPU; the model is on {device.type}",
            where="rollout.decode_attention",
            fix="set rollout.decode_attention: sdpa",
        )
    fuse = experiments.fuse_weights
    fuse = copy_bytes <= FUSE_LIMIT_BYTES if fuse is None else fuse
    lora_compute = resolve_lora_compute(options.lora_compute)
    if lora_compute == "merge" and not fuse:
        raise UserError(
            f"rollout.lora_compute: merge keeps merged copies of the adapted weights; this "
            f"model's take {copy_bytes / 2**30:.1f} GiB, more than the engine's "
            f"{FUSE_LIMIT_BYTES / 2**30:.0f} GiB for copies",
            where="rollout.lora_compute",
            fix="use rollout.lora_compute: base (bf16 low-rank path, no copies) or adapter "
            "(the default)",
        )
    return FastPath(
        attention=attention,
        fused_step=attention == "triton"
        and not options.compile_step
        and experiments.fused_step is not False,
        fused_sampling=attention == "triton" and experiments.fused_sampling,
        fuse_weights=fuse,
        cuda_graphs=device.type == "cuda" and experiments.use_cuda_graph is not False,
        keep_cache=keeps_cache(options.keep_cache),
        lora_compute=lora_compute,
    )
