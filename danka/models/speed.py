"""The speed settings that change how the model runs: ``speed.tf32`` (TF32 matmuls) and
``speed.compile`` (the training forwards' decoder layers through ``torch.compile``). Both
act on a CUDA GPU only; elsewhere they are refused (exit 2), never a silent no-op."""

from __future__ import annotations

import logging
from functools import partial

import torch

from danka.errors import UserError

log = logging.getLogger(__name__)


def _cuda_device(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def enable_tf32(enabled: bool, device) -> str | None:
    """``speed.tf32: true`` -> ``torch.set_float32_matmul_precision('high')`` (TF32 tensor
    cores for float32 matmuls). Returns the line to log; UserError (exit 2) where TF32
    does not exist (no CUDA GPU, or one older than Ampere) instead of a silent no-op."""
    if not enabled:
        return None
    if not _cuda_device(device):
        raise UserError(
            "speed.tf32 needs an NVIDIA GPU (Ampere or newer); this run is on "
            f"{torch.device(device).type}",
            where="speed.tf32",
            fix="set speed.tf32: false",
        )
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    if major < 8:
        raise UserError(
            f"speed.tf32 needs compute capability 8.0+ (Ampere), this GPU is {major}.{minor}",
            where="speed.tf32",
            fix="set speed.tf32: false",
        )
    torch.set_float32_matmul_precision("high")
    return "TF32 matmuls on (torch.set_float32_matmul_precision('high'))"


def compile_forward(model, enabled: bool, device):
    """``speed.compile: true`` -> the training forwards' decoder layers through
    ``torch.compile`` (:func:`compile_layers`). Only on a CUDA GPU: elsewhere UserError
    (exit 2), never a silent no-op. Returns the model."""
    if not enabled:
        return model
    if not _cuda_device(device):
        raise UserError(
            f"speed.compile is supported on a CUDA GPU only (this run is on "
            f"{torch.device(device).type})",
            where="speed.compile",
            fix="set speed.compile: false",
        )
    compile_layers(model)
    return model


def compile_layers(model) -> int:
    """The padding-free training forward's decoder layers through ``torch.compile``
    (``dynamic=True``: every micro-batch has another token count), one layer's code
    compiled once and reused by all (regional compilation: seconds, not the minutes of
    compiling the whole body). Inductor fuses each layer's norms, rotary embedding, SiLU
    gate and residual adds; the GEMMs and the attention stay library kernels. Only the
    training forwards take the compiled code (padding-free calls, which carry
    ``cu_seq_lens_q``, and padded ones without a KV cache); generation runs the layers
    eagerly. A compile failure is logged once and the layers run eagerly. Returns the
    layers changed."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(base.get_decoder(), "layers", None) or []
    for layer in layers:
        eager = layer.forward
        layer.forward = partial(_either, eager, torch.compile(eager, dynamic=True))
    return len(layers)


_compile_failed: list[str] = []


def _either(eager, compiled, *args, **kwargs):
    training = "cu_seq_lens_q" in kwargs or kwargs.get("use_cache") is False
    if not training or _compile_failed:
        return eager(*args, **kwargs)
    try:
        return compiled(*args, **kwargs)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - inductor/triton missing or failing: stay correct
        _compile_failed.append(str(e))
        log.warning("decoder layers: torch.compile failed (%s); running them eagerly", e)
        return eager(*args, **kwargs)
