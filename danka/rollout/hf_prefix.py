"""Shared-prefix prefill for HF ``generate``: compute each shared prompt token once.

Why: on a CPU the HF engine's time goes mostly to the prompt forward, and that forward is
mostly repeated work. A chat template puts the same system turn in front of every prompt
(SmolLM2: 25 of the quickstart's 47 prompt tokens), and GRPO samples ``n`` answers to each
prompt, so plain ``generate`` runs the same tokens through the model ``B * n`` times. Here
the longest prefix common to all prompts runs once (batch 1), each distinct remainder once
(batch B, on that cache), and the KV cache is then repeated to the ``B * n`` rows that
``generate`` continues from. HF has no option for this (its prefix-cache recipe covers one
shared prefix, not the groups), hence this module.

Layout of a row (left-aligned prefix, padding between prefix and remainder, so every row's
last prompt token sits in the last column, as with left padding)::

    [ shared prefix (p) | pad ... | remainder of prompt i ]   attention mask 1 | 0 | 1

Positions come from the mask (cumsum - 1), as ``generate`` computes them, so a padded row
gets the same positions as with left padding. The cache covers every column but the last;
``generate`` runs the last column and samples from there.
"""

from __future__ import annotations

import inspect

import torch

from danka.data.template import common_prefix, left_pad, mask_positions
from danka.rollout.fast_weights import unwrap_causal_lm

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
    """Whether this path runs ``model`` (else the caller keeps plain ``generate``)."""
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


@torch.no_grad()
def prefill(model: torch.nn.Module, prompts: list[list[int]], n: int, pad_id: int, device):
    """Prefill ``prompts`` sharing their common prefix; returns ``(ids, mask, cache)`` for
    ``generate(input_ids=ids, attention_mask=mask, **cache)``, each with ``B * n`` rows
    (row ``i * n + j`` continues prompt ``i``); ``cache`` is ``{name: DynamicCache}`` over
    ``ids[:, :-1]``, under the keyword this transformers' ``generate`` takes."""
    from transformers import DynamicCache

    root = unwrap_causal_lm(model)
    decoder = root.get_decoder()
    ids, mask, p = layout(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    positions = mask_positions(mask)
    cache = DynamicCache()
    kw = {cache_kwarg(decoder): cache}
    if p:  # 1. the shared prefix, once
        decoder(input_ids=ids[:1, :p], position_ids=positions[:1, :p], **kw)
        cache.batch_repeat_interleave(len(prompts))
    if ids.shape[1] - 1 > p:  # 2. each prompt's remainder but the last token, once
        decoder(
            input_ids=ids[:, p:-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, p:-1],
            **kw,
        )
    if n > 1:  # 3. one copy per sample
        cache.batch_repeat_interleave(n)
    return ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), {cache_kwarg(root): cache}
