"""On-device next-token sampling for the fast engine (no host sync, CUDA-graph safe).

Order as in HF ``generate``: temperature, then top-k, then top-p (nucleus, Holtzman et al.
2020, https://arxiv.org/abs/1904.09751). The draw is an exponential race: with
``E_v ~ Exp(1)`` i.i.d., ``argmax_v p_v / E_v`` is distributed as ``p`` (the Gumbel-max
trick in another form), so sampling is one elementwise pass and an argmax, with no
``multinomial`` (which may sync) and no data-dependent shapes.
"""

from __future__ import annotations

import torch

from danka.errors import UserError

MAX_EOS = 16  # end-of-sequence ids the engine checks per step (a fixed-size device tensor)


def check_eos_ids(eos_ids: list[int]) -> None:
    if len(eos_ids) > MAX_EOS:
        raise UserError(f"{len(eos_ids)} EOS ids; the fast engine takes at most {MAX_EOS}")


def sample_next(
    logits: torch.Tensor,
    *,
    greedy: bool,
    temperature: torch.Tensor,
    top_k: int = 0,
    top_p: torch.Tensor | None = None,
    gen: torch.Generator | None = None,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` (b, V) fp32 -> (tokens (b,) long, logprobs (b,)).

    ``temperature`` and ``top_p`` are 0-dim/1-element device tensors so a captured graph
    can be re-used with other values; ``top_k`` (0 = off) and whether top-p is on
    (``top_p is not None``) change the captured code, so the caller keys graphs on them.
    The log-prob is ``log_softmax(logits / temperature)`` of the chosen token, before
    top-k/top-p filtering (what the training forward computes); greedy uses temperature 1.
    ``fused`` (the engine's Triton path): without top-k/top-p, one Triton pass over each
    row (:mod:`danka.rollout.fast.triton_sample`; its own draws from ``gen``).
    """
    if fused and top_k <= 0 and top_p is None:
        from danka.rollout.fast import triton_sample  # triton: an optional dependency

        return triton_sample.sample(logits, greedy=greedy, temperature=temperature, gen=gen)
    if greedy:
        tok = logits.argmax(dim=-1)
        return tok, _logprob(logits, tok)
    z0 = z = logits / temperature
    if top_k > 0:
        kth = torch.topk(z, min(top_k, z.shape[-1]), dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None:
        srt, idx = torch.sort(z, dim=-1, descending=True)
        p = torch.softmax(srt, dim=-1)
        # Drop a token once the mass strictly before it already reaches top_p; the top
        # token always stays (mass before it is 0).
        drop = (p.cumsum(dim=-1) - p) >= top_p
        z = torch.empty_like(z).scatter_(-1, idx, srt.masked_fill(drop, float("-inf")))
    probs = torch.softmax(z, dim=-1)
    race = torch.empty_like(probs).exponential_(generator=gen).clamp_min_(1e-30)
    tok = (probs / race).argmax(dim=-1)
    return tok, _logprob(z0, tok)


def _logprob(z: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """``log_softmax(z)[tok]`` without materialising the (b, V) log-softmax."""
    return z.gather(-1, tok[:, None])[:, 0] - torch.logsumexp(z, dim=-1)
