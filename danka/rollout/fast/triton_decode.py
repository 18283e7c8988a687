"""Split-K decode attention (Triton) for the fast engine's one-token-per-row step
(``rollout.decode_attention: triton``; imported only then: it needs triton, which CUDA builds
of torch ship and CPU builds do not).

Why a kernel of our own: the fast engine (``danka/rollout/fast/model.py``, ``decode_layer``) runs
``F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)`` with the G = Hq / Hkv query
heads of a KV group as G query rows. SDPA's kernels are tiled for long queries (64+ rows
per tile); a decode step has G <= 7 query rows per KV head and a short cache (L ~ 256-384
live slots), so most of each tile is padding and at b = 64 there are only b * Hkv = 192
(row, head) tiles for 132 SMs. On an H200 the memory-efficient kernel took ~18-24 us per
layer call while the layer's K and V are ~12 MB, ~4 us of HBM traffic.

This is FlashDecoding (Dao, Haziza, Massa, Sizov 2023,
https://crfm.stanford.edu/2023/10/12/flashdecoding.html): split the keys into chunks, one
program per (row, kv head, chunk) computes a partial softmax, a second kernel combines the
chunks. Splitting keeps every SM busy at b = 64. Each program loads a K/V block once for
all G query heads of its group (GQA); G is padded to 16 rows so both products use
``tl.dot``.

Shapes: q (b, Hkv, G, D); k, v (b, Hkv, L, D) (any strides: a slice ``[..., :L, :]`` of a
(b, Hkv, T, D) cache works); ``start`` (b,) int64 and ``slot`` (1,) int64 on the device:
row i attends to slots ``start[i] <= s <= slot[0]`` (and ``s < L``). ``slot`` is read
inside the kernel and the grid depends only on shapes, so a call can be captured in a
CUDA graph. Softmax and accumulation are fp32; the output is in q's dtype. fp32 inputs (and the CPU
interpreter) use IEEE fp32 products, not TF32.

:func:`decode_attention_op` is the same function as a ``torch.library`` custom op
(``torch.ops.danka.decode_attention``), so ``torch.compile`` (``rollout.compile``) treats it
as one opaque call inside the compiled decode layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_L = 64  # keys per inner step; the engine's live length is a multiple of 64
MIN_ROWS = 16  # tl.dot needs M >= 16: the G query heads are padded up to this


@triton.jit
def _attend_block(q, kt, vb, valid, qk_scale, m_i, l_i, acc, DOT_FP32: tl.constexpr):
    """Keys ``kt`` (BLOCK_D, BLOCK_L) and values ``vb`` (BLOCK_L, BLOCK_D) of one block
    folded into the online softmax state (m_i, l_i, acc) of ``q``; slots not ``valid`` get
    no weight. ``DOT_FP32``: both products in IEEE fp32 (see :func:`_split_kernel`)."""
    if DOT_FP32:
        s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    s = s * qk_scale  # (BLOCK_G, BLOCK_L), log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if DOT_FP32:
        pv = tl.dot(p, vb.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(vb.dtype), vb)  # bf16 probabilities, as flash attention
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _attend_split(
    q_base,
    sq_g,
    sq_d,
    k_base,
    sk_l,
    sk_d,
    v_base,
    sv_l,
    sv_d,
    first,
    last,
    split,
    qk_scale,
    G,
    L,
    D,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    CHUNK: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """The online softmax state (m, l, acc) of one (row, kv head)'s queries over the valid
    slots of split ``split``: [split * CHUNK, (split + 1) * CHUNK) clipped to the row's
    [first, last] and to L."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_l = tl.arange(0, BLOCK_L)
    dmask = offs_d < D
    q = tl.load(
        q_base + offs_g[:, None] * sq_g + offs_d[None, :] * sq_d,
        mask=(offs_g < G)[:, None] & dmask[None, :],
        other=0.0,
    )  # (BLOCK_G, BLOCK_D); padded rows are 0 and are never stored
    lo = tl.maximum(split * CHUNK, first)
    hi = tl.minimum(tl.minimum(split * CHUNK + CHUNK, last + 1), L)
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    # the chunk's blocks are aligned to BLOCK_L (coalesced loads); a block without a valid
    # slot is skipped, so the running max is finite whenever a block is processed
    for i in range(0, CHUNK // BLOCK_L):
        s0 = split * CHUNK + i * BLOCK_L
        if (s0 + BLOCK_L > lo) & (s0 < hi):
            slots = s0 + offs_l
            valid = (slots >= lo) & (slots < hi)
            kt = tl.load(
                k_base + slots[None, :] * sk_l + offs_d[:, None] * sk_d,
                mask=valid[None, :] & dmask[:, None],
                other=0.0,
            )  # (BLOCK_D, BLOCK_L)
            vb = tl.load(
                v_base + slots[:, None] * sv_l + offs_d[None, :] * sv_d,
                mask=valid[:, None] & dmask[None, :],
                other=0.0,
            )  # (BLOCK_L, BLOCK_D)
            m_i, l_i, acc = _attend_block(q, kt, vb, valid, qk_scale, m_i, l_i, acc, DOT_FP32)
    return m_i, l_i, acc


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    start_ptr,
    slot_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    sq_b,
    sq_h,
    sq_g,
    sq_d,
    sk_b,
    sk_h,
    sk_l,
    sk_d,
    sv_b,
    sv_h,
    sv_l,
    sv_d,
    H,
    G,
    L,
    D,
    qk_scale,
    CHUNK: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One (row, kv head, split): online softmax over the valid slots of
    [split * CHUNK, (split + 1) * CHUNK); writes m, l (BLOCK_G,) and the unnormalised acc
    (BLOCK_G, BLOCK_D) to the scratch (b * Hkv, splits, BLOCK_G[, BLOCK_D]).

    ``DOT_FP32`` (fp32 inputs, and the CPU interpreter, whose Triton 3.6 ``tl.dot`` of bf16
    operands is wrong, values ~1e10): both products in IEEE fp32 (not TF32)."""
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    row = pid_bh // H
    head = pid_bh % H
    m_i, l_i, acc = _attend_split(
        q_ptr + row * sq_b + head * sq_h,
        sq_g,
        sq_d,
        k_ptr + row * sk_b + head * sk_h,
        sk_l,
        sk_d,
        v_ptr + row * sv_b + head * sv_h,
        sv_l,
        sv_d,
        tl.load(start_ptr + row).to(tl.int32),
        tl.load(slot_ptr).to(tl.int32),
        split,
        qk_scale,
        G,
        L,
        D,
        BLOCK_G,
        BLOCK_D,
        BLOCK_L,
        CHUNK,
        DOT_FP32,
    )
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    part = (pid_bh * tl.num_programs(1) + split) * BLOCK_G + offs_g  # scratch is contiguous
    tl.store(m_ptr + part, m_i)
    tl.store(l_ptr + part, l_i)
    tl.store(acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :], acc)


@triton.jit
def _combine_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    G,
    D,
    NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One (row, kv head): merge the splits' (m, l, acc) -> out (G, D) (contiguous)."""
    pid_bh = tl.program_id(0)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    m_all = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_all = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    for split in range(0, NUM_SPLITS):
        part = (pid_bh * NUM_SPLITS + split) * BLOCK_G + offs_g
        m_s = tl.load(m_ptr + part)
        m_new = tl.maximum(m_all, m_s)
        # an empty split has m_s = -inf, l = 0, acc = 0; guard -inf - -inf = nan while
        # every split so far was empty
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_all - m_safe)
        beta = tl.exp2(m_s - m_safe)
        l_all = l_all * alpha + tl.load(l_ptr + part) * beta
        acc_s = tl.load(acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :])
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
        m_all = m_new
    out = acc / l_all[:, None]
    mask = (offs_g[:, None] < G) & (offs_d[None, :] < D)
    dst = out_ptr + (pid_bh * G + offs_g[:, None]) * D + offs_d[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=mask)


def split_plan(rows: int, kv_heads: int, live: int, sms: int) -> tuple[int, int]:
    """(splits, chunk): up to ~16 programs per SM (rows * kv_heads * splits <= 16 * sms,
    rounded up) without splitting below one BLOCK_L block; chunk is a multiple of BLOCK_L.
    The engine's one graph attends over the whole capacity while only the slots up to the
    current one are live, so small chunks matter: a split past the live slots returns at
    once, and the live ones run in parallel instead of one after the other. Depends on
    shapes only (CUDA-graph safe)."""
    blocks = triton.cdiv(live, BLOCK_L)
    want = max(1, min(blocks, triton.cdiv(16 * sms, rows * kv_heads)))
    chunk = triton.cdiv(blocks, want) * BLOCK_L
    return triton.cdiv(live, chunk), chunk


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start: torch.Tensor,
    slot: torch.Tensor,
    splits: int | None = None,
) -> torch.Tensor:
    """q (b, Hkv, G, D), k/v (b, Hkv, L, D), start (b,) / slot (1,) int64 -> (b, Hkv, G, D).

    Row i attends to slots ``start[i] <= s <= slot[0]`` with scale D ** -0.5. ``splits``
    overrides the number of key chunks (default: :func:`split_plan` for this GPU).
    """
    b, h, g, d = q.shape
    live = k.shape[2]
    if k.shape != (b, h, live, d) or v.shape != k.shape:
        raise ValueError(f"k/v must be (b, Hkv, L, D) matching q {tuple(q.shape)}: {k.shape}")
    if q.is_cuda:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    else:
        sms = 132  # the interpreter (CPU): H200's count, so tests see the GPU's splits
    if splits is None:
        splits, chunk = split_plan(b, h, live, sms)
    else:
        chunk = triton.cdiv(triton.cdiv(live, BLOCK_L), splits) * BLOCK_L
        splits = triton.cdiv(live, chunk)
    block_g = max(MIN_ROWS, triton.next_power_of_2(g))
    block_d = max(16, triton.next_power_of_2(d))
    m = torch.empty(b * h * splits * block_g, device=q.device, dtype=torch.float32)
    l_ = torch.empty_like(m)
    acc = torch.empty(b * h * splits * block_g * block_d, device=q.device, dtype=torch.float32)
    out = torch.empty(b, h, g, d, device=q.device, dtype=q.dtype)
    log2e = 1.4426950408889634
    _split_kernel[(b * h, splits)](
        q,
        k,
        v,
        start,
        slot,
        m,
        l_,
        acc,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        h,
        g,
        live,
        d,
        d**-0.5 * log2e,
        CHUNK=chunk,
        BLOCK_G=block_g,
        BLOCK_D=block_d,
        BLOCK_L=BLOCK_L,
        DOT_FP32=not q.is_cuda or q.dtype == torch.float32,
    )
    _combine_kernel[(b * h,)](
        m, l_, acc, out, g, d, NUM_SPLITS=splits, BLOCK_G=block_g, BLOCK_D=block_d
    )
    return out


@torch.library.custom_op("danka::decode_attention", mutates_args=())
def decode_attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor, slot: torch.Tensor
) -> torch.Tensor:
    """:func:`decode_attention` as ``torch.ops.danka.decode_attention`` (default splits)."""
    return decode_attention(q, k, v, start, slot)


@decode_attention_op.register_fake
def _(q, k, v, start, slot):
    return q.new_empty(q.shape)  # contiguous (b, Hkv, G, D), as the kernel writes it
