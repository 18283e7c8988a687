"""The fast engine's own forward pass for Llama-family decoders (Llama, SmolLM2, Qwen2).

Weights come from :func:`danka.rollout.fast.weights.load_weights` (live, fused q/k/v and
gate/up, LoRA adapters unmerged: every linear is ``x @ W.T + b + (x @ A.T) @ B.T``).

Shapes: b = sequences, P = prompt length (left-padded), T = KV-cache capacity, H = hidden,
Hq/Hkv = query/key-value heads (GQA group G = Hq // Hkv), D = head dim, V = vocab.
The KV cache is ``(layers, B, Hkv, T, D)``; every sequence writes slot ``t`` at the same time
and masks its own left padding with ``start`` (first real slot).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from danka.rollout.fast.weights import ModelSpec, Weights


def rope_tables(root: nn.Module, spec: ModelSpec, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin ``(length, D)`` for positions 0..length-1 (Su et al. 2021,
    https://arxiv.org/abs/2104.09864), the values of HF's rotary embedding.

    ``inv_freq`` and ``attention_scaling`` come from the model's own rotary module, so
    ``rope_theta`` and static scalings (linear, llama3, yarn) follow the config. The sin
    table's first half is negated so that ``rotate_half(x) * sin == roll(x, D/2) * sin_s``
    exactly (same products, one kernel fewer).
    """
    rot = root.model.rotary_emb
    inv_freq = rot.inv_freq.to(device=spec.device, dtype=torch.float32)
    pos = torch.arange(length, device=spec.device, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = getattr(rot, "attention_scaling", 1.0)
    cos, sin = (emb.cos() * scale).to(spec.dtype), (emb.sin() * scale).to(spec.dtype)
    half = spec.head_dim // 2
    sin[:, :half] = -sin[:, :half]
    return cos, sin


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm ``w * x / sqrt(mean(x^2) + eps)`` (Zhang & Sennrich 2019), statistics in fp32.

    On CUDA the fused kernel (one launch instead of ~7; it rounds once where HF rounds
    twice in bf16); elsewhere HF LlamaRMSNorm's exact op sequence.
    """
    if x.is_cuda and x.dtype == w.dtype and hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dt)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_s: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) * sin = roll(x) * sin_s``."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_s


def _lin(w: Weights, key: str, x: torch.Tensor) -> torch.Tensor:
    """``x @ W.T + b`` plus the unmerged LoRA path ``(x @ A.T) @ (s * B).T``, summed before
    one rounding to the base dtype, as peft's forward does.

    Kernels per adapted (fused) linear: low-rank path in the adapter's dtype (fp32): cast x,
    A GEMM, B GEMM, one in-place add that rounds once (peft's op order exactly); in the base
    dtype with A folded into the base GEMM (``.la`` None): ONE ``addmm`` (base output + B
    part, fp32 accumulation, one rounding) after the widened base GEMM.
    """
    lb = w[key + ".lb"]
    if w[key] is None:  # unfused parts (no weight copies): one GEMM each
        parts = [w[k] for k in (f"{key}.0", f"{key}.1", f"{key}.2") if k in w]
        y = torch.cat([F.linear(x, p) for p in parts], dim=-1)
        if w[key + ".b"] is not None:
            y = y + w[key + ".b"]
    else:
        y = F.linear(x, w[key], w[key + ".b"])
    if lb is None:
        return y
    la = w[key + ".la"]
    if la is None:  # folded: y = [x @ W.T + b | x @ A.T]
        n = lb.shape[0]
        z = y.flatten(0, -2)
        return _add_low_rank(z[:, :n], z[:, n:], lb).view(*y.shape[:-1], n)
    if la.dtype == y.dtype:
        u = F.linear(x, la).flatten(0, -2)
        return _add_low_rank(y.flatten(0, -2), u, lb).view(y.shape)
    # fp32 adapters: the in-place add computes float(y) + delta and rounds once into y
    return y.add_(F.linear(F.linear(x.to(la.dtype), la), lb))


_INPLACE_ADDMM = [True]  # False once a backend refuses addmm_ into a strided view


def _add_low_rank(y: torch.Tensor, u: torch.Tensor, lb: torch.Tensor) -> torch.Tensor:
    """``y + u @ lb.T`` (2-D) in one GEMM (fp32 accumulation, one rounding), written into
    ``y`` in place (no copy kernel); out of place if the backend refuses the strided view
    (decided once, during eager warm-up, never inside a CUDA-graph capture)."""
    if _INPLACE_ADDMM[0]:
        try:
            return y.addmm_(u, lb.T)
        except RuntimeError:
            _INPLACE_ADDMM[0] = False
    return torch.addmm(y, u, lb.T)


def _embed(w: Weights, ids: torch.Tensor) -> torch.Tensor:
    x = F.embedding(ids, w["embed"])
    la = w["embed.la"]
    if la is None:
        return x
    return (x + F.linear(F.embedding(ids, la), w["embed.lb"])).to(x.dtype)


def _mlp(w: Weights, p: str, x: torch.Tensor) -> torch.Tensor:
    """The MLP of the layer whose weights are keyed ``p + "gu"``, ``p + "down"``."""
    g, u = _lin(w, p + "gu", x).chunk(2, dim=-1)
    return _lin(w, p + "down", F.silu(g) * u)


def _logits(w: Weights, spec: ModelSpec, h: torch.Tensor, fp32: bool = True) -> torch.Tensor:
    out = _lin(w, "lm_head", rms_norm(h, w["norm"], spec.eps))
    return out.float() if fp32 else out


def _qkv(w: Weights, spec: ModelSpec, i: int, x: torch.Tensor, cos, sin):
    """Layer i's attention inputs for ``x`` (p, L, H): q (p, Hq, L, D) and k, v
    (p, Hkv, L, D), RoPE applied to q and k together (one set of kernels for both)."""
    p, length = x.shape[:2]
    nqk = spec.heads + spec.kv_heads
    qk_dim = nqk * spec.head_dim
    qkv = _lin(w, f"{i}.qkv", rms_norm(x, w[f"{i}.ln1"], spec.eps))
    qk = _rope(qkv[..., :qk_dim].view(p, length, nqk, spec.head_dim), cos, sin).transpose(1, 2)
    v = qkv[..., qk_dim:].view(p, length, spec.kv_heads, spec.head_dim).transpose(1, 2)
    return qk[:, : spec.heads], qk[:, spec.heads :], v


def prefill(
    w: Weights,
    spec: ModelSpec,
    ids: torch.Tensor,
    mask: torch.Tensor,
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: slice,
    n: int,
) -> torch.Tensor:
    """Run left-padded prompts ``ids``/``mask`` (p, P) and return last-position logits (p, V).

    Keys/values go to cache slots ``[0, P)`` of rows ``rows``, each prompt repeated ``n``
    times (sample ``i * n + j`` answers prompt ``i``). RoPE positions count real tokens only.
    """
    p, plen = ids.shape
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    cos, sin = cos_t[pos][:, :, None], sin_t[pos][:, :, None]  # (p, P, 1, D)
    causal = torch.ones(plen, plen, dtype=torch.bool, device=ids.device).tril()
    allowed = causal[None] & mask.bool()[:, None, :]
    # Padding query rows see only themselves: keeps them finite; nothing reads them.
    allowed |= torch.eye(plen, dtype=torch.bool, device=ids.device)[None]
    allowed = allowed[:, None]  # (p, 1, P, P)
    x = _embed(w, ids)
    for i in range(spec.layers):
        q, k, v = _qkv(w, spec, i, x, cos, sin)
        k_cache[i, rows, :, :plen] = k.repeat_interleave(n, dim=0)
        v_cache[i, rows, :, :plen] = v.repeat_interleave(n, dim=0)
        x = _attend_and_mlp(w, spec, i, x, q, k, v, allowed)
    return _logits(w, spec, x[:, -1])


def _attend_and_mlp(w: Weights, spec: ModelSpec, i: int, x, q, k, v, allowed) -> torch.Tensor:
    """The rest of layer ``i`` after q/k/v: attention of q (p, H, N, D) over k/v
    (p, KV, S, D) under ``allowed`` (p, 1, N, S), output projection, MLP (residuals)."""
    group = spec.heads // spec.kv_heads
    att = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), attn_mask=allowed
    )
    att = att.transpose(1, 2).reshape(x.shape[0], x.shape[1], spec.q_dim)
    x = x + _lin(w, f"{i}.o", att)
    return x + _mlp(w, f"{i}.", rms_norm(x, w[f"{i}.ln2"], spec.eps))


def extend(
    w: Weights,
    spec: ModelSpec,
    ids: torch.Tensor,
    mask: torch.Tensor,
    pos: torch.Tensor,
    start: torch.Tensor,
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: slice,
    lo: int,
) -> torch.Tensor:
    """Prefill only NEW tokens after a cached prefix -> last-position logits (p, V).

    ``ids``/``mask`` (p, N) are left-padded new tokens at cache slots ``[lo, lo + N)`` of
    rows ``rows``; ``pos`` (p, N) their RoPE positions (the prefix length plus their index);
    row i's prefix is cached at slots ``[start[i], lo + N - n_i)`` (n_i = its new tokens).
    Keys/values are written for real tokens only (a padded window slot keeps the prefix
    token cached there); each new token attends to slots ``[start[i], its slot]``.
    """
    p, n = ids.shape
    hi = lo + n
    cos, sin = cos_t[pos][:, :, None], sin_t[pos][:, :, None]  # (p, N, 1, D)
    slots = torch.arange(hi, device=ids.device)
    qslot = slots[lo:, None]  # (N, 1)
    allowed = (slots[None, None, :] >= start[:, None, None]) & (slots[None] <= qslot[None])
    allowed = (allowed | (slots[None] == qslot[None]))[:, None]  # (p, 1, N, hi); pads: self
    write = mask.bool()[:, None, :, None]  # (p, 1, N, 1)
    x = _embed(w, ids)
    for i in range(spec.layers):
        q, k, v = _qkv(w, spec, i, x, cos, sin)
        for cache, new in ((k_cache, k), (v_cache, v)):
            window = cache[i, rows, :, lo:hi]
            window.copy_(torch.where(write, new, window))
        x = _attend_and_mlp(
            w, spec, i, x, q, k_cache[i, rows, :, :hi], v_cache[i, rows, :, :hi], allowed
        )
    return _logits(w, spec, x[:, -1])


def decode_forward(
    w: Weights,
    spec: ModelSpec,
    tok: torch.Tensor,
    pos: torch.Tensor,
    slot: torch.Tensor,
    start: torch.Tensor,
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer=None,
    attention: str = "sdpa",
    fused: bool = False,
    fp32: bool = True,
) -> torch.Tensor:
    """One token for each of b sequences -> next-token logits (b, V) fp32 (``fp32=False``:
    the head's dtype, for a sampler that reads it directly: no (b, V) copy).

    ``tok``/``pos``/``start`` are (b,), ``slot`` is (1,): the token's KV goes to ``slot``
    and it attends to slots ``[start, slot]`` of the cache's T slots. No host sync and no
    shape that depends on data, so the whole call can be captured in a CUDA graph.
    ``layer``: the per-layer function (default :func:`decode_layer`; the engine passes a
    ``torch.compile``d one with ``compile=True``); its weights come from
    :func:`split_layers`. ``attention``: ``"sdpa"`` (masked SDPA) or ``"triton"`` (the
    split-K kernel of :mod:`danka.rollout.fast.triton_decode`, which reads ``start``/``slot``
    instead of a mask; that module must have been imported). ``fused``: the layers run
    :func:`decode_layer_fused` (Triton attention and :mod:`danka.rollout.fast.triton_step`'s
    kernels; ``layer`` and ``attention`` are then not used).
    """
    layer = layer or decode_layer
    if fused:
        x = _embed(w, tok)
        for i, lw in enumerate(split_layers(w, spec.layers)):
            x = decode_layer_fused(
                lw, spec, x, cos_t, sin_t, pos, k_cache[i], v_cache[i], slot, start
            )
        return _logits(w, spec, x, fp32)
    mask = None
    if attention == "sdpa":
        t = k_cache.shape[3]
        slots = torch.arange(t, device=tok.device)
        valid = (slots[None, :] >= start[:, None]) & (slots[None, :] <= slot)
        zero = torch.zeros((), dtype=spec.dtype, device=tok.device)
        mask = torch.where(valid, zero, float("-inf"))[:, None, None, :]  # (b, 1, 1, T)
    cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]  # (b, 1, D)
    x = _embed(w, tok)
    for i, lw in enumerate(split_layers(w, spec.layers)):
        x = layer(lw, spec, x, cos, sin, k_cache[i], v_cache[i], slot, mask, start)
    return _logits(w, spec, x, fp32)


def split_layers(w: Weights, layers: int) -> list[Weights]:
    """Per layer ``i``, its entries of ``w`` without the ``"i."`` prefix (``"qkv"``,
    ``"ln1"``...), in one pass over ``w``: every layer's dict has the same keys, shapes and
    dtypes, so one compiled :func:`decode_layer` serves all layers."""
    out: list[Weights] = [{} for _ in range(layers)]
    for key, value in w.items():
        head, dot, rest = key.partition(".")
        if dot and head.isdigit():
            out[int(head)][rest] = value
    return out


def decode_layer(
    lw: Weights, spec: ModelSpec, x, cos, sin, k, v, slot, mask, start=None
) -> torch.Tensor:
    """One decoder layer for one token per row: x (b, H), cos/sin (b, 1, D), this layer's
    cache k/v (b, Hkv, T, D) (slot ``slot`` written here), additive mask (b, 1, 1, T); with
    ``mask=None`` the split-K Triton kernel attends to slots ``[start, slot]`` instead."""
    b = x.shape[0]
    nqk = spec.heads + spec.kv_heads
    qk_dim = nqk * spec.head_dim
    group = spec.heads // spec.kv_heads
    qkv = _lin(lw, "qkv", rms_norm(x, lw["ln1"], spec.eps))
    # RoPE on q and k together: one set of kernels for both.
    qk = _rope(qkv[:, :qk_dim].view(b, nqk, spec.head_dim), cos, sin)
    q, kn = qk[:, : spec.heads], qk[:, spec.heads :]
    k.index_copy_(2, slot, kn.unsqueeze(2))
    v.index_copy_(2, slot, qkv[:, qk_dim:].view(b, spec.kv_heads, 1, spec.head_dim))
    # GQA without copying K/V: the G query heads of a group act as G query positions.
    qg = q.view(b, spec.kv_heads, group, spec.head_dim)
    if mask is None:  # rollout.decode_attention: triton (danka.rollout.fast.triton_decode)
        att = torch.ops.danka.decode_attention(qg, k, v, start, slot)
    else:
        att = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
    x = x + _lin(lw, "o", att.reshape(b, spec.q_dim))
    return x + _mlp(lw, "", rms_norm(x, lw["ln2"], spec.eps))


def decode_layer_fused(
    lw: Weights, spec: ModelSpec, x, cos_t, sin_t, pos, k, v, slot, start
) -> torch.Tensor:
    """:func:`decode_layer` (Triton attention) in the fewest launches: RoPE and the cache
    write in one kernel, ``silu(g) * u`` in one, the residual adds inside the output GEMMs
    (``x.addmm_``), a live adapter's expand step in one kernel per fused projection
    (:mod:`danka.rollout.fast.triton_step`). ``x`` (b, H) is updated in place; cos/sin are the
    whole tables (T, D), ``pos`` (b,) the rows' positions. Plain layer: 10 launches (the
    unfused one ~18). Each fused op rounds once where the unfused ones round per op."""
    from danka.rollout.fast import triton_step

    b = x.shape[0]
    qkv = _lin_fused(lw, "qkv", rms_norm(x, lw["ln1"], spec.eps))
    q = triton_step.rope_write(qkv, cos_t, sin_t, pos, slot, k, v, spec.heads)
    att = torch.ops.danka.decode_attention(q, k, v, start, slot).reshape(b, spec.q_dim)
    x = _residual_add(lw, "o", x, att)
    act = triton_step.silu_mul(_lin_fused(lw, "gu", rms_norm(x, lw["ln2"], spec.eps)))
    return _residual_add(lw, "down", x, act)


def _shrunk(w: Weights, key: str, x: torch.Tensor):
    """(``x @ W.T + b``, the adapter's ``u = x @ A.T``) of an adapted projection: one GEMM
    when A is folded into W's rows (``lora_compute: base``), a second (in the adapter's
    dtype) when it is not."""
    lb, la = w[key + ".lb"], w[key + ".la"]
    if la is None:  # folded: one GEMM gives [x @ W.T + b | x @ A.T] (zero bias on A rows)
        z = F.linear(x, w[key], w[key + ".b"])
        return z[:, : lb.shape[0]], z[:, lb.shape[0] :]
    return F.linear(x, w[key], w[key + ".b"]), F.linear(x.to(la.dtype), la)


def _lin_fused(w: Weights, key: str, x: torch.Tensor) -> torch.Tensor:
    """:func:`_lin` with the adapter's expand step in one kernel (``triton_step.lora_expand``)."""
    if w[key] is None or w[key + ".lb"] is None:
        return _lin(w, key, x)
    from danka.rollout.fast import triton_step

    y, u = _shrunk(w, key, x)
    return triton_step.lora_expand(y, u, w[key + ".lb"])


def _residual_add(w: Weights, key: str, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``x + linear(a)`` in place: plain, the sum inside the GEMM (``x.addmm_``: fp32
    accumulation, one rounding); adapted, ``x + y + u @ B.T`` in one kernel after the GEMM.
    A bias or unfused parts: the unfused ops."""
    if w[key] is None or w[key + ".b"] is not None:
        return x + _lin(w, key, a)
    if w[key + ".lb"] is None:
        return x.addmm_(a, w[key].T)
    from danka.rollout.fast import triton_step

    y, u = _shrunk(w, key, a)
    return triton_step.lora_expand(x, u, w[key + ".lb"], y=y)
