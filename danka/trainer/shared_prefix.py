"""Shared-prefix training forward: the prompt prefix all sequences of a micro-batch share
(a chat template's system turn) runs through the model once, with gradients.

Why: on a CPU the update is compute-bound and a quickstart sequence is 47 prompt tokens
(25 of them SmolLM2's system turn, identical in every row) + ~14 response tokens, so ~40%
of the update's forward and backward recomputes the same tokens. Here the prefix runs once
(batch 1), its KV cache is repeated to the micro-batch's rows (``repeat_interleave``: the
backward sums the rows' gradients into the one prefix forward), and the rows run on top of
it. Same result as the plain forward up to floating-point rounding (tests/trainer).

Layout as in ``danka.rollout.hf_prefix`` (prefix | pad | rest of the prompt | response);
positions from the mask, as the plain forward and generation compute them.

Used only where it is exact and measured: a CPU device (the GPU backward kernels have not
been checked with it yet), one process (under FSDP2 the second forward of a step finds the
first one's gathered weights freed), no gradient checkpointing (HF turns the cache off under it), no
compiled body, no active dropout (one forward of the prefix would share its dropout mask
across rows), an architecture of ``PREFIX_MODEL_TYPES`` and a prefix of >= MIN_PREFIX
tokens.
"""

from __future__ import annotations

import torch

from danka.rollout.hf_prefix import cache_kwarg, common_prefix_len, layout, usable
from danka.types import RolloutBatch

MIN_PREFIX = 8  # below this the extra batch-1 forward costs more than it saves


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
    prefix does not apply (the caller then runs the plain forward)."""
    from transformers import DynamicCache

    if mb.size < 2 or not applies(model, decoder, device):
        return None
    prompts = unpadded_prompts(mb)
    p = common_prefix_len(prompts)
    if p < MIN_PREFIX:
        return None
    ids, mask, _ = layout(prompts, pad_id=0)
    width = ids.shape[1] - p  # the rest of the prompts, padded on the left
    ids = torch.cat([ids, mb.response_ids], dim=1).to(device)
    mask = torch.cat([mask, mb.response_mask.long()], dim=1).to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    kw = {cache_kwarg(decoder): cache, "use_cache": True}
    decoder(input_ids=ids[:1, :p], position_ids=pos[:1, :p], **kw)  # 1. the prefix, once
    cache.batch_repeat_interleave(mb.size)  # 2. one (differentiable) copy per row
    out = decoder(input_ids=ids[:, p:], attention_mask=mask, position_ids=pos[:, p:], **kw)
    r = mb.response_ids.shape[1]
    # 3. column p + c of the full row is column c here; the response token j is predicted
    # at full column p + width - 1 + j
    return out.last_hidden_state[:, width - 1 : width - 1 + r]
