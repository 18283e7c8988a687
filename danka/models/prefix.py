"""The shared-prefix layout both the HF engine's prefill (danka.rollout.hf_prefix) and the
training forward (danka.step.shared_prefix) run prompts in: the tokens every prompt
shares go through the model once.

Layout of a row (left-aligned prefix, padding between prefix and remainder, so every row's
last prompt token sits in the last column, as with left padding)::

    [ shared prefix (p) | pad ... | remainder of prompt i ]   attention mask 1 | 0 | 1

Positions come from the mask (cumsum - 1), as ``generate`` computes them, so a padded row
gets the same positions as with left padding.
"""

from __future__ import annotations

import inspect

import torch

from danka.data.template import common_prefix, left_pad
from danka.models.unwrap import unwrap_causal_lm

# Architectures checked to give generate's own tokens through this path (tests/rollout):
# plain decoder caches with 1-D RoPE positions. Others (sliding window, hybrid or
# recurrent caches, multimodal positions) keep the plain path.
PREFIX_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# Attention that takes the padding between prefix and rest as a plain 2-D mask (flash-attn
# unpads by the mask; not checked with this layout, so it keeps the plain path).
PREFIX_ATTENTION = ("sdpa", "eager")


def common_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the longest token prefix all ``prompts`` share, at most ``len - 1`` of the
    shortest (every row keeps >= 1 token for ``generate`` to run)."""
    first = prompts[0]
    return min(min(common_prefix(first, p) for p in prompts), min(map(len, prompts)) - 1)


def layout(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``prompts`` (B lists) -> ids, mask (B, p + R) in the layout above, and p."""
    p = common_prefix_len(prompts)
    rest, rest_mask = left_pad([q[p:] for q in prompts], pad_id)
    head = torch.tensor(prompts[0][:p], dtype=torch.long).expand(len(prompts), p)
    return torch.cat([head, rest], 1), torch.cat([torch.ones_like(head), rest_mask], 1), p


def usable(model: torch.nn.Module) -> bool:
    """Whether the shared-prefix layout runs ``model`` (else the caller keeps its plain path)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False  # FSDP2's hooks gather the weights in the model's forward, not here
    root = unwrap_causal_lm(model)
    cfg = getattr(root, "config", None)
    return (
        getattr(cfg, "model_type", None) in PREFIX_MODEL_TYPES
        and getattr(cfg, "_attn_implementation", None) in PREFIX_ATTENTION
        and not getattr(cfg, "use_sliding_window", False)
        and hasattr(root, "get_decoder")
    )


def cache_kwarg(decoder: torch.nn.Module) -> str:
    """The name the installed transformers gives the KV-cache argument: ``cache`` from
    5.2x on (``past_key_values`` is deprecated there), ``past_key_values`` before."""
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
