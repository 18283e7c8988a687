"""The GPU bytes a colocated vLLM engine holds for the whole run, from the model's shape.

vLLM starts with ``gpu_memory_utilization`` x the card and keeps it until the run ends
(``rollout.keep_cache: true``; by default it sleeps between rollouts and keeps only
``VllmShare.asleep``): its own copy of the weights, the activations of its largest
forward (profiled at start-up with ``max_num_batched_tokens`` tokens, and ``max_num_seqs``
rows of fp32 logits in the sampler), its CUDA graphs and workspaces, and the paged KV
cache, which gets whatever of the share is left. danka sizes the share so the KV cache
holds every sequence of a generate call at full length (no preemption):

* weights     params x d (a 4-bit base as the plan prices it; plus one LoRA slot in adapter
              mode)
* KV cache    L x 2 x kv x d x sequences x max_model_len rounded up to 16-token blocks
* work        max_num_batched_tokens x d x (3H + q + 2kv + 3I) (one layer's transients)
              + sequences x V x 4 x 3 (sampler logits, probabilities, log-probs)
              + ``RESERVE_BYTES`` (CUDA graphs, torch.compile and attention workspaces,
              allocator slack; not yet measured against a real engine)

The memory plan (danka/planning) adds this share to the rollout, and ``asleep`` (or, kept
awake, the whole share) to every other phase; the trainer passes ``share / card`` to vLLM
as its ``gpu_memory_utilization``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from danka.rollout.vllm.calls import VLLM_BLOCK, batched_tokens

GIB = 2**30
RESERVE_BYTES = GIB
MAX_FRACTION = 0.95  # vLLM is never given more than this of the card


@dataclass(frozen=True)
class VllmShare:
    """The bytes of each part of vLLM's share (see the module docstring)."""

    weights: int
    kv_cache: int
    work: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.work

    @property
    def asleep(self) -> int:
        """What vLLM still holds while it sleeps: its CUDA graphs, workspaces and persistent
        buffers (``RESERVE_BYTES``). Its forward's activations and its sampler's logits come
        from torch's caching allocator, which the update then reuses; weights and KV cache
        live in the pool sleep unmaps."""
        return RESERVE_BYTES

    def fraction(self, card_bytes: int) -> float:
        """``gpu_memory_utilization`` for a card of ``card_bytes``: the share rounded up to
        a thousandth, at most ``MAX_FRACTION``."""
        return min(MAX_FRACTION, math.ceil(1000 * self.total / card_bytes) / 1000)


def vllm_share(
    shape: dict[str, int],
    *,
    dtype_bytes: int,
    weight_bytes: int,
    sequences: int,
    max_model_len: int,
    adapter_bytes: int = 0,
) -> VllmShare:
    """vLLM's share for a model of ``shape`` (H, I, L, V, q, kv as danka.models.dims reads them)
    generating ``sequences`` at once, each up to ``max_model_len`` tokens."""
    d, h, i, v = dtype_bytes, shape["H"], shape["I"], shape["V"]
    q, kv = shape["q"], shape["kv"]
    blocks = -(-max_model_len // VLLM_BLOCK) * VLLM_BLOCK
    kv_cache = shape["L"] * 2 * kv * d * sequences * blocks
    batched = batched_tokens(sequences, max_model_len)
    work = batched * d * (3 * h + q + 2 * kv + 3 * i) + sequences * v * 4 * 3 + RESERVE_BYTES
    return VllmShare(weights=weight_bytes + adapter_bytes, kv_cache=kv_cache, work=work)
