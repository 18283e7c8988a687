"""RMSNorm through PyTorch's own fused kernel (``torch.nn.functional.rms_norm``).

Why: transformers' Llama/Qwen2/Qwen3/Mistral RMSNorm is six operators (an fp32 copy, square,
mean, rsqrt, multiply, a cast back, the weight), each a pass over (tokens, hidden) forward
and more backward. At the GSM8K step's shape the update's norms and casts took ~410 ms of
its 1.2 s of kernels (H100, ``update_graphs_05b.json``: norm/softmax/reduce 171 ms, copies
and casts 240 ms, part of them the norms'), and every operator is a launch the LoRA update
waits on. ``F.rms_norm`` computes the same normalisation in one kernel forward (CUDA: fp32
inside) and one backward.

The numbers are transformers' up to one rounding: ``x * rsqrt(mean(x^2) + eps) * w`` is
rounded to the input's dtype once, where transformers rounds before the weight and after it
(``tests/models/test_fused_norm.py``). Only the classes whose forward is exactly that
formula are swapped (not Gemma's ``1 + w``).

Off by default until measured on a GPU: ``install`` / ``uninstall`` are the A/B
(``python -m bench train --only update_05b --update-variants ...+fusednorm``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from danka.models import class_swap

PLAIN = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})


class _Fused:
    """Mixed into a plain RMSNorm's class by :func:`install` (:mod:`danka.models.class_swap`)."""

    def forward(self, hidden_states):
        shape = (hidden_states.shape[-1],)
        return F.rms_norm(hidden_states, shape, self.weight, self.variance_epsilon)


def install(model: nn.Module) -> int:
    """Route every plain RMSNorm of ``model`` through ``F.rms_norm``; returns how many."""
    n = 0
    for module in model.modules():
        if type(module).__name__ in PLAIN and hasattr(module, "variance_epsilon"):
            class_swap.swap_in(module, _Fused)
            n += 1
    return n


def uninstall(model: nn.Module) -> None:
    for module in model.modules():
        class_swap.swap_out(module, _Fused)
