"""Next-token sampling in one pass over the vocabulary (Triton), for temperature sampling
and greedy decoding (top-k / top-p keep the torch ops of :mod:`danka.rollout.fast.sampling`).
The fast engine uses it with ``FastExperiments(fused_sampling=True)`` on its Triton path:
off by default until measured on a GPU (``bench rollout --sides
fast-triton,fast-triton-fusedsample --profile``; tested on Triton's CPU interpreter only).

Why: with a 151,936-token vocabulary the torch sampler was ~31% of the decode step's GPU
time (H100, 256 rows: fp32 softmax, two divisions, the exponential draws, clamp, argmax and
logsumexp are each a pass over (rows, vocabulary); `rollout_qwen05_gsm8k_256x512.json`'s
profile). Here one program per row reads its logits once and keeps, per lane, a running
log-sum-exp and the best Gumbel key:

    z_v = logit_v / T,   key_v = z_v - log(E_v),   E_v = -log(U_v) ~ Exp(1)
    token = argmax_v key_v   (distributed as softmax(z): the exponential race of sampling.py)
    log-prob = z_token - logsumexp(z)

``U`` is Philox (``tl.rand``) keyed by a seed the engine's generator draws on the device
each step (so a captured CUDA graph draws new numbers every replay and a seed gives the
same tokens) plus the row. Greedy: ``key = z`` at temperature 1, the first maximum as in
``torch.argmax``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # vocabulary entries a program reads per iteration


@triton.jit
def _sample_kernel(
    logits_ptr,
    stride,
    temp_ptr,
    seed_ptr,
    tok_ptr,
    lp_ptr,
    VOCAB: tl.constexpr,  # one compile per vocabulary size (a model's)
    GREEDY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    if GREEDY:
        inv_t = 1.0
    else:
        inv_t = 1.0 / tl.load(temp_ptr).to(tl.float32)
    seed = tl.load(seed_ptr) + row
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)  # running max of z, per lane
    s = tl.zeros([BLOCK], tl.float32)  # running sum of exp(z - m), per lane
    best = tl.full([BLOCK], float("-inf"), tl.float32)  # best key, per lane
    best_i = tl.zeros([BLOCK], tl.int32)
    best_z = tl.zeros([BLOCK], tl.float32)
    base = logits_ptr + row.to(tl.int64) * stride
    for start in range(0, VOCAB, BLOCK):
        cols = start + lanes
        inside = cols < VOCAB
        z = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, z)
        live = m_new > float("-inf")
        s = tl.where(live, s * tl.exp(m - m_new) + tl.exp(z - m_new), 0.0)
        m = m_new
        if GREEDY:
            key = z
        else:
            e = tl.maximum(-tl.log(tl.rand(seed, cols)), 1e-30)
            key = z - tl.log(e)
        key = tl.where(inside, key, float("-inf"))
        better = key > best
        best = tl.where(better, key, best)
        best_i = tl.where(better, cols, best_i)
        best_z = tl.where(better, z, best_z)
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(s * tl.exp(m - top), axis=0))
    k = tl.max(best, axis=0)
    tok = tl.min(tl.where(best == k, best_i, VOCAB), axis=0)
    z_tok = tl.max(tl.where((best == k) & (best_i == tok), best_z, float("-inf")), axis=0)
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(lp_ptr + row, z_tok - lse)


def sample(
    logits: torch.Tensor,
    *,
    greedy: bool,
    temperature: torch.Tensor,
    gen: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits`` (b, V), any float dtype -> (tokens (b,) long, log-probs (b,) fp32): the
    module docstring's draw. ``temperature``: a 1-element device tensor (a captured graph
    reads it at replay); ``gen``: the generator the per-step seed is drawn from."""
    b, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    tok = torch.empty(b, dtype=torch.long, device=logits.device)
    lp = torch.empty(b, dtype=torch.float32, device=logits.device)
    seed = torch.randint(0, 2**62, (1,), generator=gen, device=logits.device)
    _sample_kernel[(b,)](
        logits,
        logits.stride(0),
        temperature,
        seed,
        tok,
        lp,
        VOCAB=vocab,
        GREEDY=greedy,
        BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
    )
    return tok, lp
