"""Token log-probs and entropies without materialising the full float32 logits.

For hidden states ``h`` (N, H), output embedding ``W`` (V, H) and temperature ``T``::

    z = h W^T / T                       (N, V) logits, C rows at a time: the GEMM in W's
                                        dtype (bf16 on a GPU), z and what follows float32
    logp_i = z_{i, y_i} - logsumexp(z_i)
    H_i = logsumexp(z_i) - sum_v p_iv z_iv          (entropy of softmax(z_i))

Backward, per chunk, recomputing ``z`` (p = softmax(z), g = upstream grads)::

    dL/dz = g_logp * (onehot(y) - p) - g_H * p * (log p + H)
    dL/dh = (dL/dz / T) W,   dL/dW = (dL/dz / T)^T h

so peak memory is O(C * V) instead of O(N * V): with V = 152k, N = 8k response tokens the
full float32 logits would be 5 GB. The same trick as Liger-Kernel's fused linear
cross-entropy (Hsu et al. 2024, https://arxiv.org/abs/2410.10989), in plain PyTorch.

On CUDA the elementwise part of each chunk (the statistics forward; dz backward, written
straight in the GEMM's dtype) runs as ``torch.compile``d functions: eager PyTorch made many
separate passes over the (C, V) float32 logits (elementwise + copies: 86 of 137 ms of kernel
time in a 0.5B-shape update on an H200, bench/results/train_update_05b.json); inductor
fuses them into a few reductions (head alone 3.2x faster, update 0.205 -> 0.123 s,
bench/results/train_update_05b.json). Rows
are a dynamic dimension (one compiled graph serves every chunk length). ``fused=False``
(``speed.fused_logprob_head: false``, or a compile failure, logged once) runs the same
functions eagerly.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__name__)
_compiled: dict[str, object] = {}


def _chunk_stats(z: torch.Tensor, targets: torch.Tensor, entropy: bool):
    """z (C, V) float32 -> (logp (C,), entropy (C,) or None, lse (C,), p (C, V) or None)."""
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not entropy:
        return logp, None, lse, None
    p = torch.exp(z - lse[:, None])
    return logp, lse - (p * z).sum(-1), lse, p


def _head_stats(z: torch.Tensor, y: torch.Tensor, inv_t: float, entropy: bool):
    """Raw logits z (C, V) float32 -> (logp (C,), entropy (C,) or None) at temperature
    1 / inv_t."""
    lp, ent, _, _ = _chunk_stats(z * inv_t, y, entropy)
    return lp, ent


def _head_dz(z, y, g_lp, g_ent, inv_t: float, dtype: torch.dtype) -> torch.Tensor:
    """Raw logits z (C, V) float32, upstream grads g_lp / g_ent (C,) (g_ent None: no
    entropy term) -> dL/d(raw z) (C, V) in ``dtype`` (the GEMMs' dtype)."""
    z = z * inv_t
    _, ent, lse, p = _chunk_stats(z, y, entropy=True)
    dz = -p * g_lp[:, None]
    dz = dz.scatter_add(1, y[:, None], g_lp[:, None])  # + g_lp at the target (no sync)
    if g_ent is not None:
        dz = dz - g_ent[:, None] * p * ((z - lse[:, None]) + ent[:, None])
    return (dz * inv_t).to(dtype)


def _run(name: str, fused: bool, fn, z: torch.Tensor, *args):
    """``fn(z, *args)``: compiled on CUDA when ``fused`` (rows marked dynamic), else (or
    after a compile failure, logged once) eagerly."""
    if not (fused and z.is_cuda and _compiled.get(name, True) is not None):
        return fn(z, *args)
    compiled = _compiled.get(name)
    if compiled is None:
        compiled = _compiled[name] = torch.compile(fn, dynamic=None)
    for t in (z,) + tuple(a for a in args if isinstance(a, torch.Tensor)):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    try:
        return compiled(z, *args)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - inductor/triton missing or failing: stay correct
        log.warning("log-prob head: torch.compile failed (%s); running it eagerly", e)
        _compiled[name] = None
        return fn(z, *args)


def _logits32(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``h @ weight.T`` as float32 logits, without an fp32 copy of a bf16/fp16 ``weight``.

    On CUDA the low-precision GEMM writes float32 directly (``out_dtype``: no rounding of
    the logits to bf16); elsewhere a low-precision product is widened after the GEMM.
    """
    if weight.dtype == torch.float32:
        return F.linear(h.float(), weight)
    h = h.to(weight.dtype)
    if h.is_cuda:
        try:
            return torch.mm(h, weight.T, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):  # older torch: no out_dtype
            pass
    return F.linear(h, weight).float()


def _grad_weight_add(acc: torch.Tensor, dz: torch.Tensor, h: torch.Tensor, dtype) -> None:
    """``acc += dz.T @ h`` in float32; the GEMM in ``dtype`` (bf16) on CUDA when it can."""
    if dtype != torch.float32 and dz.is_cuda:
        try:
            torch.addmm(acc, dz.T.to(dtype), h.to(dtype), out_dtype=torch.float32, out=acc)
            return
        except (TypeError, RuntimeError, NotImplementedError):
            pass
    acc.addmm_(dz.T.float(), h.float())


class _ChunkedLinearLogprobs(torch.autograd.Function):
    """Forward and backward chunk by chunk (see the module docstring). The GEMMs run in the
    head's dtype (bf16 on a GPU) with float32 logits; softmax statistics, log-probs,
    entropies and dz are float32. No float32 copy of the (V, H) head is made."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, compute_entropy, fused):
        n = hidden.shape[0]
        logps = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ents = torch.zeros(n if compute_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk_size):
            z = _logits32(hidden[s : s + chunk_size], weight)
            y = targets[s : s + chunk_size]
            lp, ent = _run("stats", fused, _head_stats, z, y, 1.0 / temperature, compute_entropy)
            logps[s : s + chunk_size] = lp
            if compute_entropy:
                ents[s : s + chunk_size] = ent
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.compute_entropy, ctx.fused = compute_entropy, fused
        return logps, ents

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        hidden, weight, targets = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )
        use_ent = ctx.compute_entropy and grad_ent is not None and grad_ent.numel() > 0
        for s in range(0, hidden.shape[0], ctx.chunk_size):
            h = hidden[s : s + ctx.chunk_size]
            y = targets[s : s + ctx.chunk_size]
            g_lp = grad_logp[s : s + ctx.chunk_size].float()
            g_ent = grad_ent[s : s + ctx.chunk_size].float() if use_ent else None
            z = _logits32(h, weight)
            dz = _run(
                "dz", ctx.fused, _head_dz, z, y, g_lp, g_ent, 1.0 / ctx.temperature, weight.dtype
            )
            del z
            if need_h:
                grad_h[s : s + ctx.chunk_size] = (dz @ weight).to(hidden.dtype)
            if need_w:
                _grad_weight_add(grad_w, dz, h, weight.dtype)
        if need_w:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None, None


def chunked_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor | nn.Module,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
    softcap: float | None = None,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h W^T / T)[y] and its entropy, ``chunk_size`` rows of logits at a time.
    ``fused``: on CUDA, the per-chunk elementwise work runs compiled (module docstring).

    hidden (N, H), weight (V, H), targets (N,) long -> logprobs (N,) float32 and
    entropy (N,) float32 (None unless ``compute_entropy``). Differentiable in hidden and weight.
    ``weight`` may also be the lm_head module: a plain bias-free ``nn.Linear`` uses its weight;
    anything else (LoRA-wrapped head, bias, ``softcap`` of Gemma 2) is called chunk by chunk.
    """
    if isinstance(weight, nn.Module):
        if isinstance(weight, nn.Linear) and weight.bias is None and not softcap:
            weight = weight.weight
        else:
            return _chunked_module_logprobs(
                weight,
                hidden,
                targets.long(),
                temperature=float(temperature),
                chunk_size=int(chunk_size),
                compute_entropy=compute_entropy,
                softcap=softcap,
            )
    elif softcap:
        raise ValueError("softcap needs the lm_head module, not its weight")
    if hidden.dim() != 2 or weight.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"expected hidden (N, H), weight (V, H), targets (N,); got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    logps, ents = _ChunkedLinearLogprobs.apply(
        hidden,
        weight,
        targets.long(),
        float(temperature),
        int(chunk_size),
        compute_entropy,
        bool(fused),
    )
    return logps, (ents if compute_entropy else None)


def _chunked_module_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    compute_entropy: bool,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same as :func:`chunked_logprobs_entropy` for any head module (LoRA-wrapped lm_head,
    bias, Gemma-2 soft-capping): each chunk runs under activation checkpointing."""

    def chunk(h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = head(h).float()
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        lp, ent, _, _ = _chunk_stats(z / temperature, y, compute_entropy)
        return lp, (ent if ent is not None else lp.new_zeros(0))

    logps, ents = [], []
    for s in range(0, hidden.shape[0], chunk_size):
        h, y = hidden[s : s + chunk_size], targets[s : s + chunk_size]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(chunk, h, y, use_reentrant=False)
        else:
            lp, ent = chunk(h, y)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if compute_entropy else None)
