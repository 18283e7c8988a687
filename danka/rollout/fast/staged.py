"""Staged decode for the fast engine: a KV cache sized to the work.

Why: a rollout samples many answers at once, and the KV cache of every row is sized for the
longest answer allowed (prompt + ``max_new_tokens``). With an end token most answers of a
real model finish long before that (SmolLM2's to GSM8K-style questions: ~50 of 256 tokens),
so most of that cache is never read. Here the rows first hold the prompt + ``first_stage``
new tokens; the rows still going then move, compacted into the smallest batch bucket, to a
cache of the full length, one layer at a time (:meth:`LayerCache.moved`). Without an end
token (random weights) every row moves and the peak is the full cache plus one layer.

The full-length stage keeps compacting. A decode step costs about rows x attended length,
and the answers end at very different lengths (GSM8K: most at 150-300 of 512 tokens), so
rows kept until the longest answer ends would waste most of the late steps. At each host
check of "all finished" (every ``check_every`` steps, a sync that happens anyway), once the
rows still going fit a batch of at most half the rows (``bucket_size(alive) <= b // 2``;
without graphs, exact counts: ``alive <= b // 2``), they move again to a full-length cache of
that batch. Halving, not any smaller batch: each move copies the cache and, on CUDA,
captures the step again, so a call of ``b`` rows moves at most ``log2(b / 8)`` more times
(``log2(b)`` without graphs). The output rows keep their places (``idx``: each stage row's
original row).

Each stage captures its own CUDA graph, before its state is filled (a capture's warm-up
writes cache slot ``T - 1`` and resets the decode state), in a graph pool of the call's own:
the graphs point at this call's caches and die with it. Greedy decoding gives the tokens of
one full-size cache; a sampled row may draw other numbers once compacted (its row moved).
"""

from __future__ import annotations

import torch

from danka.rollout.fast.model import rope_tables
from danka.rollout.fast.slots import BUCKETS, LayerCache, Slots, bucket_size


def run_staged(eng, root, w, prompts, params, eos_ids, pad_id, graphs: bool, first: int, t: int):
    """``FastEngine._run`` in stages: ``first`` then ``t`` cache slots (see the module
    docstring) -> (token lists, log-prob lists), one per sample."""
    eng._owner = None
    eng._cos, eng._sin = rope_tables(root, eng._spec, t)
    kept_pool, eng._pool = eng._pool, None  # this call's graphs: a pool of their own
    try:
        return _staged(eng, w, prompts, params, eos_ids, pad_id, graphs, first, t)
    finally:
        eng._pool = kept_pool  # the stage graphs (and their pool) die with this call


def _staged(eng, w, prompts, params, eos_ids, pad_id, graphs: bool, first: int, t: int):
    spec, n, new = eng._spec, params.n, params.max_new_tokens
    rows = len(prompts) * n
    plen = max(len(p) for p in prompts)
    b = bucket_size(rows, graphs)
    k = LayerCache.zeros(
        spec.layers, (b, spec.kv_heads, first, spec.head_dim), spec.dtype, spec.device
    )
    v = LayerCache.zeros(spec.layers, k.shape[1:], spec.dtype, spec.device)
    st, key = _stage_slots(eng, b, first, params, eos_ids, pad_id)
    eng._ensure_graph(w, st, key, k, v, graphs, plen, min(new, first - plen + 1))
    lens = eng._prefill_prompts(w, st, key, k, v, prompts, n, pad_id)
    eng._start_decode(st, lens, plen)
    out_tok = torch.full((rows, new), pad_id, dtype=torch.long, device=spec.device)
    out_lp = torch.zeros((rows, new), dtype=torch.float32, device=spec.device)
    idx = torch.arange(rows, device=spec.device)  # original row of each stage row
    ran, cap, shrink = 0, first, 0  # the first stage ends when its cache is full
    while True:
        ran, finished = eng._decode_steps(w, st, key, k, v, plen, ran, new, cap, graphs, shrink)
        m = len(idx)
        out_tok[idx, : ran + 1] = st.out_tok[:m, : ran + 1]
        out_lp[idx, : ran + 1] = st.out_lp[:m, : ran + 1]
        if finished:
            break
        eng.stats["compactions"] += int(cap == t)  # a move within the full length
        alive = (~st.done[:m]).nonzero()[:, 0]  # host sync, once per stage
        idx, b = idx[alive], bucket_size(len(alive), graphs)
        length = plen + ran  # cache slots written so far
        k = k.moved(alive, length, (b, spec.kv_heads, t, spec.head_dim))
        v = v.moved(alive, length, (b, spec.kv_heads, t, spec.head_dim))
        old, (st, key) = st, _stage_slots(eng, b, t, params, eos_ids, pad_id)
        eng._ensure_graph(w, st, key, k, v, graphs, length, new - ran)
        _carry_over(old, st, alive, ran)
        cap, shrink = t, compact_at(b, graphs)
    eng.stats["steps"] += ran
    return out_tok[:, : ran + 1].tolist(), out_lp[:, : ran + 1].tolist()


def compact_at(b: int, graphs: bool) -> int:
    """The most rows still going at which a stage of ``b`` rows moves to a smaller batch:
    the largest ``a`` with ``bucket_size(a, graphs) <= b // 2`` (0: never, e.g. ``b = 8``
    with graphs, whose buckets start at 8)."""
    half = b // 2
    if not graphs:
        return half
    if half >= BUCKETS[-1]:  # above the largest bucket, batches are multiples of it
        return half // BUCKETS[-1] * BUCKETS[-1]
    return max((s for s in BUCKETS if s <= half), default=0)


def _stage_slots(eng, b: int, t: int, params, eos_ids, pad_id):
    """Fresh decode state for a (b, t) stage (never shared with the engine's cached
    ``_slots``: its graphs point at this call's stage caches) and its graph key."""
    st = Slots.new(b, t, eng._spec.device)
    return st, eng._fill_settings(st, params, eos_ids, pad_id)


def _carry_over(old: Slots, st: Slots, alive: torch.Tensor, ran: int) -> None:
    """Move the decode state of rows ``alive`` of ``old`` to rows ``[0, m)`` of ``st`` (the
    rows after them: finished padding), output columns ``[0, ran]`` included."""
    m = len(alive)
    st.tok.fill_(st.pad)
    st.tok[:m] = old.tok[alive]
    st.pos.zero_()
    st.pos[:m] = old.pos[alive]
    st.start.zero_()
    st.start[:m] = old.start[alive]
    st.done.fill_(True)
    st.done[:m] = old.done[alive]
    st.slot.copy_(old.slot)
    st.gen.copy_(old.gen)
    st.out_tok[:m, : ran + 1] = old.out_tok[alive, : ran + 1]
    st.out_lp[:m, : ran + 1] = old.out_lp[alive, : ran + 1]
