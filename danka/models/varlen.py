"""Padding-free (varlen) training forwards: a micro-batch's sequences laid end to end in one
row, attention kept inside each sequence by cumulative lengths, as verl's
``use_remove_padding`` and FlashAttention's varlen kernels do.

Layout (:func:`pack_flat`): sequence i's real prompt tokens then its real response tokens,
all sequences concatenated into one row of T = sum of real lengths tokens; position ids
restart at 0 for each sequence (the same positions as the padded forward, which counts
positions over the attention mask), ``cu_seqlens`` = [0, l_0, l_0 + l_1, ...]. No token of
padding is computed, and the attention of a token sees exactly its own sequence's earlier
tokens, so the hidden states equal the padded forward's up to floating-point rounding.

Attention (:func:`varlen_attention`, registered with transformers' ``AttentionInterface``
as ``danka_varlen`` and switched on only inside :func:`varlen_forward`): on CUDA,
``torch.nn.attention.varlen.varlen_attn`` (FlashAttention's varlen kernel inside PyTorch);
elsewhere one causal ``scaled_dot_product_attention`` per sequence (the CPU path the tests
compare with the padded forward).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "danka_varlen"
_registered = False


@dataclass(frozen=True)
class Flat:
    """One micro-batch laid end to end (module docstring); b sequences, R response columns."""

    input_ids: torch.Tensor  # (1, T) long
    position_ids: torch.Tensor  # (1, T) long, restarting at 0 for each sequence
    cu_seqlens: torch.Tensor  # (b + 1,) int32
    max_len: int  # the longest sequence
    predict_at: torch.Tensor  # (N,) long: the flat position predicting each real response token
    valid: torch.Tensor  # (b, R) bool: the real response tokens (row-major order of predict_at)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_flat(mb) -> Flat:
    """Lay a micro-batch (left-padded prompts ``prompt_ids``/``prompt_mask`` (b, P),
    right-padded responses ``response_ids``/``response_mask`` (b, R)) end to end."""
    mask = torch.cat([mb.prompt_mask.bool(), mb.response_mask.bool()], dim=1)
    ids = torch.cat([mb.prompt_ids, mb.response_ids], dim=1)
    lengths = mask.sum(1)
    pos = mask.long().cumsum(1) - 1
    starts = torch.cumsum(lengths, 0) - lengths  # each sequence's first flat position
    valid = mb.response_mask.bool()
    p_len = mb.prompt_mask.sum(1).long()
    cols = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    # response token j of row i sits at flat starts_i + p_i + j, predicted one position earlier
    predict = (starts + p_len - 1)[:, None] + cols
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=lengths.device)
    cu[1:] = torch.cumsum(lengths, 0)
    return Flat(
        input_ids=ids[mask][None],
        position_ids=pos[mask][None],
        cu_seqlens=cu,
        max_len=int(lengths.max()),
        predict_at=predict[valid],
        valid=valid,
    )


def _find_kernel():
    """torch's varlen attention and its keywords (the causal one changed name between
    torch versions: ``is_causal``, later ``window_size``)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, frozenset()
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


_KERNEL = _find_kernel()  # read once: the attention below runs inside torch.compile too


def available(device: torch.device) -> bool:
    """Whether the padding-free forward runs fast on ``device`` (CUDA with torch's varlen
    kernel); elsewhere it still runs (per-sequence attention) but gains nothing."""
    return torch.device(device).type == "cuda" and _KERNEL[0] is not None


def wanted(setting: bool | None, device) -> bool:
    """``speed.packed_update``: null = where it runs fast (:func:`available`)."""
    return available(device) if setting is None else bool(setting)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def varlen_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers' attention-interface signature: query (1, Hq, T, D), key/value
    (1, Hkv, T, D) -> ((1, T, Hq, D), None), attending within ``cu_seq_lens_q``."""
    cu, max_len = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, D)
    groups = q.shape[1] // k.shape[1]
    fn, params = _KERNEL
    if q.is_cuda and fn is not None and q.dtype in (torch.float16, torch.bfloat16):
        extra = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        if "enable_gqa" in params and groups > 1:
            extra["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        out = fn(q, k, v, cu, cu, max_len, max_len, scale=scaling, **extra)
        return out[None], None
    outs = []
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e == s:  # an empty sequence (body_graphs pads the cumulative lengths with them)
            continue
        qs, ks, vs = (t[s:e].transpose(0, 1)[None] for t in (q, k, v))
        o = F.scaled_dot_product_attention(
            qs, _repeat_kv(ks, groups), _repeat_kv(vs, groups), is_causal=True, scale=scaling
        )
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)[None], None


def register() -> None:
    """Make ``danka_varlen`` known to transformers' attention interface. Idempotent. No
    mask function is registered: transformers then builds no mask and skips its check of
    the position ids for packed sequences (a host sync per forward, and a capture error
    under ``speed.cuda_graphs``); the cumulative lengths carry the structure."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention)
    _registered = True


@contextmanager
def _attention(config):
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def supports(decoder: torch.nn.Module) -> bool:
    """Decoders whose attention goes through transformers' interface as plain full causal
    attention (Llama, Qwen2, Qwen3, Mistral without a sliding window...): not a sliding
    window, not soft-capped attention logits (Gemma 2), which the varlen kernel would drop;
    on CUDA in 16 bits (the kernel's dtypes: an fp32 model keeps the padded forward)."""
    config = getattr(decoder, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    weight = next(decoder.parameters())
    if weight.is_cuda and weight.dtype not in (torch.float16, torch.bfloat16):
        return False  # FlashAttention's varlen kernel takes 16-bit inputs only
    if getattr(config, "attn_logit_softcapping", None):
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in layer_types):
        return False
    return not (getattr(config, "use_sliding_window", False) and config.sliding_window)


def varlen_forward(decoder: torch.nn.Module, flat: Flat, device) -> torch.Tensor:
    """Hidden states (T, H) of ``flat`` through ``decoder`` (the transformer body)."""
    return eager_forward(
        decoder,
        flat.input_ids.to(device, non_blocking=True),
        flat.position_ids.to(device, non_blocking=True),
        flat.cu_seqlens.to(device, non_blocking=True),
        flat.max_len,
    )


def eager_forward(
    decoder, input_ids, position_ids, cu_seqlens, max_len: int, inputs_embeds=None
) -> torch.Tensor:
    """Hidden states (T, H) of sequences laid end to end (``input_ids`` and
    ``position_ids`` (1, T), ``cu_seqlens`` (b + 1,) int32, all on the decoder's device;
    no sequence longer than ``max_len``); or of ``inputs_embeds`` (1, T, H), with
    ``input_ids`` None."""
    register()
    with _attention(decoder.config):
        out = decoder(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            attention_mask=None,
            use_cache=False,
            cu_seq_lens_q=cu_seqlens,
            cu_seq_lens_k=cu_seqlens,
            max_length_q=max_len,
            max_length_k=max_len,
        )
    return out.last_hidden_state[0]
