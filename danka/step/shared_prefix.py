"""Shared-prefix training forward: prompt tokens that several sequences of a micro-batch
share run through the model once, with gradients.

Why: on a CPU the update is compute-bound. A quickstart sequence is 47 prompt tokens (27 of
them the same in every row: SmolLM2's system turn) + ~14 response tokens, and GRPO puts 8
answers to each prompt in the batch, so most of the update's forward and backward
recomputes the same prompt tokens. Here, per micro-batch:

1. the prefix common to all prompts runs once (batch 1);
2. each distinct prompt's rest runs once, on copies of that KV cache (one row per prompt);
3. each row's response runs on its prompt's cache (``batch_select_indices``).

Copies and selections are differentiable: the backward sums the rows' gradients into the
one forward of each shared token. Same result as the plain forward up to floating-point
rounding (tests/step/test_shared_prefix.py). Prompts are laid out as in
``danka.models.prefix`` (prefix | pad | rest); positions come from the mask, as the
plain forward and generation compute them.

Used only where it is exact and measured: a CPU device (the GPU backward kernels have not
been checked with it yet), one process (under FSDP2 the second forward of a step found the
first one's gathered weights freed), no gradient checkpointing (HF turns the cache off
under it), no compiled body, no active dropout (one forward of a shared token would share
its dropout mask across rows), an architecture of ``PREFIX_MODEL_TYPES``, and something to
share: a common prefix of >= MIN_PREFIX tokens or a prompt that repeats.
"""

from __future__ import annotations

import torch

from danka.data.template import distinct, mask_positions
from danka.models.prefix import cache_kwarg, common_prefix_len, layout, usable
from danka.types import RolloutBatch

MIN_PREFIX = 8  # a shorter common prefix pays only where prompts repeat (GRPO groups)


def unpadded_prompts(mb: RolloutBatch) -> list[list[int]]:
    """The left-padded ``prompt_ids`` (b, P) -> one token list per row."""
    lengths = mb.prompt_mask.sum(1).tolist()
    width = mb.prompt_ids.shape[1]
    return [mb.prompt_ids[i, width - n :].tolist() for i, n in enumerate(lengths)]


def applies(model: torch.nn.Module, decoder: torch.nn.Module, device: torch.device) -> bool:
    """Whether the shared-prefix forward may run ``model`` (see the module docstring)."""
    if device.type != "cpu" or not usable(model):  # usable: one process only, too
        return False  # (FSDP2 freed the gathered weights after the first of the 2 forwards)
    if getattr(decoder, "gradient_checkpointing", False) or "forward" in vars(decoder):
        return False  # checkpointing drops the cache; a compiled body was replaced
    return not (
        model.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    )


def response_hidden(
    model: torch.nn.Module, decoder: torch.nn.Module, mb: RolloutBatch, device: torch.device
) -> torch.Tensor | None:
    """Hidden states predicting the response tokens (b, R, H), or None where the shared
    forward does not apply or saves nothing (the caller then runs the plain forward)."""
    from transformers import DynamicCache

    if mb.size < 2 or not applies(model, decoder, device):
        return None
    unique, row_of = distinct(unpadded_prompts(mb))  # a GRPO group: one prompt
    p = common_prefix_len(unique)
    if p < MIN_PREFIX and len(unique) == mb.size:
        return None
    row_of = torch.tensor(row_of, device=device)  # row -> its prompt in ``unique``
    ids, mask, _ = layout(unique, pad_id=0)
    ids, mask = ids.to(device), mask.to(device)
    pos = mask_positions(mask)
    cache = DynamicCache()
    kw = {cache_kwarg(decoder): cache, "use_cache": True}
    if p:  # 1. the prefix all prompts share, once
        decoder(input_ids=ids[:1, :p], position_ids=pos[:1, :p], **kw)
        cache.batch_repeat_interleave(len(unique))  # differentiable copies
    # 2. each distinct prompt's rest, once; its last column predicts response token 0
    out = decoder(input_ids=ids[:, p:], attention_mask=mask, position_ids=pos[:, p:], **kw)
    first = out.last_hidden_state[row_of, -1:]  # (b, 1, H)
    r = mb.response_ids.shape[1]
    if r == 1:
        return first
    # 3. every row's response on its prompt's cache (indexing: the backward sums the rows)
    cache.batch_select_indices(row_of)
    resp = mb.response_ids[:, : r - 1].to(device)
    full = torch.cat([mask[row_of], mb.response_mask[:, : r - 1].long().to(device)], dim=1)
    rpos = mask_positions(full)[:, -(r - 1) :]
    out = decoder(input_ids=resp, attention_mask=full, position_ids=rpos, **kw)
    return torch.cat([first, out.last_hidden_state], dim=1)  # token j from column j - 1
