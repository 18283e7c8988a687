"""Fused kernels (Triton) for the fast engine's decode step: fewer, larger launches per layer.

Why: a decode step of a small model is a chain of ~600 tiny kernels, each a few
microseconds whatever its size (SmolLM2-135M at 64 rows: the layer's weights are 7 MB, about
2 us of HBM traffic, but the step took ~70 us a layer). What costs is the number of
launches, so the step is cut to the fewest (``danka.rollout.fast.model.decode_layer_fused``):

* :func:`rope_write`: RoPE on the new token's query and key heads and the key/value write
  into the KV cache slot, one launch (it replaces ~8: two products, a roll, a sum, a split,
  two ``index_copy_`` and a copy of the strided v);
* :func:`silu_mul`: ``silu(gate) * up`` of the fused gate|up output, one launch (from 2);
* :func:`lora_expand`: a live LoRA adapter's expand step ``y += u @ B.T`` (and, for an
  output projection, the residual ``x += y + u @ B.T``) for a whole fused projection, one
  launch; the shrink ``u = x @ A.T`` rides in the projection's own GEMM when A is folded
  into it (``lora_compute: base``), so an adapted projection costs one launch more than a
  plain one (peft's order takes 4 more: cast x, two GEMMs, the add).

Each kernel computes in fp32 and rounds once to the output dtype (the unfused ops round to
bf16 after every elementwise op; the difference is within bf16 rounding). The residual adds
need no kernel: ``x.addmm_(a, W.T)`` sums into the residual stream inside the GEMM.

Every function reads device tensors only (no host sync, shapes fixed per call), so the step
can be captured in a CUDA graph. CPU builds of torch have no triton: the engine imports this
module only where its decode attention is Triton's (:mod:`danka.rollout.fast.triton_decode`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_write_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    k_ptr,
    v_ptr,
    q_ptr,
    s_qkv,
    s_cos,
    sk_b,
    sk_h,
    sk_l,
    sv_b,
    sv_h,
    sv_l,
    HQ,
    HKV,
    G,
    D,
    HALF: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One (row, kv head): its G query heads and its key rotated at position ``pos[row]``
    (``x * cos + roll(x, D/2) * sin_s``, ``sin_s`` = the signed table of
    :func:`danka.rollout.fast.model.rope_tables`), the key and value written to cache slot
    ``slot[0]``, the rotated queries to ``q`` (b, HKV, G, D) contiguous."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    pos = tl.load(pos_ptr + row)
    slot = tl.load(slot_ptr)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    rot = (offs_d + HALF) % D  # roll(x, D/2)[d] = x[(d - D/2) mod D] = x[(d + D/2) mod D]
    cos = tl.load(cos_ptr + pos * s_cos + offs_d, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * s_cos + offs_d, mask=dmask, other=0.0).to(tl.float32)
    base = qkv_ptr + row * s_qkv

    offs_g = tl.arange(0, BLOCK_G)
    m2 = (offs_g < G)[:, None] & dmask[None, :]
    col = (head * G + offs_g)[:, None] * D
    q = tl.load(base + col + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
    qr = tl.load(base + col + rot[None, :], mask=m2, other=0.0).to(tl.float32)
    out = q * cos[None, :] + qr * sin[None, :]
    dst = q_ptr + ((row * HKV + head) * G + offs_g[:, None]) * D + offs_d[None, :]
    tl.store(dst, out.to(q_ptr.dtype.element_ty), mask=m2)

    kcol = base + (HQ + head) * D
    k = tl.load(kcol + offs_d, mask=dmask, other=0.0).to(tl.float32)
    kr = tl.load(kcol + rot, mask=dmask, other=0.0).to(tl.float32)
    kout = k * cos + kr * sin
    tl.store(
        k_ptr + row * sk_b + head * sk_h + slot * sk_l + offs_d,
        kout.to(k_ptr.dtype.element_ty),
        mask=dmask,
    )
    v = tl.load(base + (HQ + HKV + head) * D + offs_d, mask=dmask, other=0.0)
    tl.store(v_ptr + row * sv_b + head * sv_h + slot * sv_l + offs_d, v, mask=dmask)


def rope_write(
    qkv: torch.Tensor,
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
    pos: torch.Tensor,
    slot: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """qkv (b, (Hq + 2 Hkv) * D) (rows may be strided), cos/sin tables (T, D), pos (b,),
    slot (1,) int64, this layer's cache k/v (b, Hkv, T, D) (last dim contiguous) ->
    rotated queries (b, Hkv, G, D); k/v slot ``slot`` now hold the new key (rotated) and
    value. Same values as ``model._rope`` + ``index_copy_`` up to one rounding."""
    b, hkv, _, d = k.shape
    if qkv.stride(1) != 1 or k.stride(3) != 1 or v.stride(3) != 1 or cos_t.stride(1) != 1:
        raise ValueError("rope_write: the last dimensions must be contiguous")
    g = heads // hkv
    q = torch.empty(b, hkv, g, d, device=qkv.device, dtype=qkv.dtype)
    _rope_write_kernel[(b, hkv)](
        qkv,
        cos_t,
        sin_t,
        pos,
        slot,
        k,
        v,
        q,
        qkv.stride(0),
        cos_t.stride(0),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        heads,
        hkv,
        g,
        d,
        HALF=d // 2,
        BLOCK_G=triton.next_power_of_2(g),
        BLOCK_D=triton.next_power_of_2(d),
    )
    return q


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, s_gu, s_out, INTER, BLOCK: tl.constexpr):
    """One (row, block of the intermediate): ``silu(g) * u`` with g, u the halves of gu."""
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < INTER
    g = tl.load(gu_ptr + row * s_gu + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_gu + INTER + offs, mask=m, other=0.0).to(tl.float32)
    out = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * s_out + offs, out.to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu (b, 2 I) = [gate | up] (rows may be strided) -> silu(gate) * up (b, I)."""
    b, two_i = gu.shape
    inter = two_i // 2
    if gu.stride(1) != 1:
        raise ValueError("silu_mul: the last dimension must be contiguous")
    out = torch.empty(b, inter, device=gu.device, dtype=gu.dtype)
    block = 1024
    _silu_mul_kernel[(b, triton.cdiv(inter, block))](
        gu, out, gu.stride(0), out.stride(0), inter, BLOCK=block
    )
    return out


@triton.jit
def _lora_expand_kernel(
    x_ptr,
    y_ptr,
    u_ptr,
    b_ptr,
    M,
    N,
    s_x,
    s_y,
    s_u,
    s_b,
    R: tl.constexpr,
    HAS_Y: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One (row block, column block): ``x (+ y) + u @ B.T`` summed in fp32 (the low-rank
    product over R in blocks of BLOCK_R), rounded once into x. ``UPCAST``: both products
    in IEEE fp32 (fp32 adapters; and the CPU interpreter, whose Triton 3.6 ``tl.dot`` of
    bf16 operands is wrong); else bf16 operands with fp32 accumulation. R is a
    compile-time constant (a model's stacked ranks take a few values)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        ranks = r0 + tl.arange(0, BLOCK_R)
        km = ranks < R
        u = tl.load(
            u_ptr + rows[:, None] * s_u + ranks[None, :],
            mask=rmask[:, None] & km[None, :],
            other=0.0,
        )
        bt = tl.load(
            b_ptr + cols[None, :] * s_b + ranks[:, None],
            mask=km[:, None] & cmask[None, :],
            other=0.0,
        )  # (BLOCK_R, BLOCK_N) = B.T block
        if UPCAST:
            acc += tl.dot(u.to(tl.float32), bt.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(u, bt)
    mask = rmask[:, None] & cmask[None, :]
    dst = x_ptr + rows[:, None] * s_x + cols[None, :]
    acc += tl.load(dst, mask=mask, other=0.0).to(tl.float32)
    if HAS_Y:
        acc += tl.load(y_ptr + rows[:, None] * s_y + cols[None, :], mask=mask, other=0.0).to(
            tl.float32
        )
    tl.store(dst, acc.to(x_ptr.dtype.element_ty), mask=mask)


def lora_expand(
    x: torch.Tensor, u: torch.Tensor, b: torch.Tensor, y: torch.Tensor | None = None
) -> torch.Tensor:
    """``x += (y) + u @ b.T`` in place, summed in fp32 and rounded once into x: a LoRA
    adapter's expand step after its shrink ``u = x_in @ A.T`` (computed by the projection's
    own GEMM when A is folded into it). ``y`` (optional): the projection's output, for the
    residual form ``x + linear(a)``.

    x, y (M, N) and u (M, R) may have strided rows (last dimension contiguous); b (N, R)
    contiguous (the engine's block-diagonal, pre-scaled B of a fused projection,
    ``danka.rollout.fast.weights``); u and b of one dtype: bf16 (``lora_compute: base``) or
    fp32 (``adapter``, IEEE fp32 products: peft's fp32 path up to summation order).
    """
    m, n = x.shape
    r = u.shape[1]
    strided_ok = all(t is None or t.stride(1) == 1 for t in (x, y, u))
    if not strided_ok or not b.is_contiguous() or u.dtype != b.dtype:
        raise ValueError(
            "lora_expand: rows contiguous in their last dim, b contiguous, u/b one dtype"
        )
    if u.shape[0] != m or b.shape != (n, r) or (y is not None and y.shape != x.shape):
        raise ValueError(f"lora_expand: shapes x {x.shape}, u {u.shape}, b {b.shape}")
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    block_r = min(64, max(16, triton.next_power_of_2(r)))
    block_n = 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _lora_expand_kernel[grid](
        x,
        x if y is None else y,
        u,
        b,
        m,
        n,
        x.stride(0),
        x.stride(0) if y is None else y.stride(0),
        u.stride(0),
        b.stride(0),
        R=r,
        HAS_Y=y is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_R=block_r,
        UPCAST=u.dtype == torch.float32 or not x.is_cuda,
    )
    return x
