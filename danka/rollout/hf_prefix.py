"""Shared-prefix prefill for HF ``generate``: compute each shared prompt token once.

Why: on a CPU the HF engine's time goes mostly to the prompt forward, and that forward is
mostly repeated work. A chat template puts the same system turn in front of every prompt
(SmolLM2: 25 of the quickstart's 47 prompt tokens), and GRPO samples ``n`` answers to each
prompt, so plain ``generate`` runs the same tokens through the model ``B * n`` times. Here
the longest prefix common to all prompts runs once (batch 1), each distinct remainder once
(batch B, on that cache), and the KV cache is then repeated to the ``B * n`` rows that
``generate`` continues from. HF has no option for this (its prefix-cache recipe covers one
shared prefix, not the groups), hence this module.

The rows are laid out as :mod:`danka.models.prefix` says (shared prefix | pad | rest);
the cache covers every column but the last; ``generate`` runs the last column and samples
from there.
"""

from __future__ import annotations

import torch

from danka.data.template import mask_positions
from danka.models.prefix import cache_kwarg, layout
from danka.models.unwrap import unwrap_causal_lm


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
