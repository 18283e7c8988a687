"""Multi-turn generation on the fast engine, keeping each sample's KV cache across turns.

An agent rollout (:mod:`danka.agent.loop`) generates turn after turn for the same samples;
between two turns a continuing sample only gains a few tokens (a tool response and the
next assistant header). ``FastEngine.generate`` would prefill the whole prefix again each
turn; a session prefills only what its cache does not hold yet. Per turn:

1. match: sample ``key`` re-uses the longest common prefix of the tokens its cache row
   holds and its new sequence, up to all but the last token (whose logits start the turn);
   a new key, or a sequence edited earlier, is prefilled from where it differs;
2. relayout: rows are compacted (samples that ended drop out) and right-aligned so every
   sequence ends at slot ``plen - 1`` (the decode writes one slot for all rows); a cached
   key carries its RoPE position (tokens before it), not its slot, so moving it is exact;
3. extend: only the new tokens run through the model (:func:`model.extend`),
   attending to the cached prefix; when nothing is cached (the first turn) each distinct
   sequence is prefilled once and its rows copied (the loop holds n copies of a prompt);
4. decode with the engine's step (and CUDA graphs); row i then holds its sequence plus
   the sampled tokens that were fed back, up to the first EOS.

Against ``FastEngine.generate`` on the same sequences the logits agree to float rounding
(the prefix's keys/values come from other kernels), so greedy tokens agree but at exact
near-ties (the tests check equality in fp32). Full re-prefill instead when the batch
exceeds one decode batch (``max_batch``: the cache holds one), or when another call used
the cache in between. A cache too short for the next turn grows, its contents copied
(old and new cache both alive for that moment). The model must not change while a
session is open (its cache would be stale).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from danka.data.template import common_prefix, distinct, left_pad
from danka.errors import UserError
from danka.rollout.base import SamplingParams, finish_batch
from danka.rollout.fast.model import extend, prefill
from danka.rollout.fast.sampling import check_eos_ids
from danka.types import RolloutBatch


@dataclass
class _Held:
    tokens: list[int]  # the tokens whose keys/values cache row ``row`` holds, in order
    row: int
    start: int  # slot of the first of them (they fill [start, start + len(tokens)))


class FastSession:
    """The turns of one multi-turn rollout on a :class:`~danka.rollout.fast.FastEngine`
    (see the module docstring); open with ``engine.session(...)``, ``close()`` at the end.

    ``stats``: ``prefill_tokens`` (tokens run through a prefill), ``reused_tokens`` (their
    keys/values copied instead: held from an earlier turn, or, in the first turn, from
    another sample with the same prompt); without a session every token is prefilled.
    """

    def __init__(self, engine, model, *, eos_ids, pad_id, generator=None):
        check_eos_ids(eos_ids)
        self.engine, self.model, self.generator = engine, model, generator
        self.eos_ids, self.pad_id = list(eos_ids), pad_id
        self.held: dict[Hashable, _Held] = {}
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0}
        self._used = False

    def close(self) -> None:
        """Forget the held prefixes; free the cache if the engine does not keep it."""
        self.held = {}
        if self.engine._owner is self:
            self.engine._owner = None
        path = self.engine._path  # None before the engine ran a model
        if self._used and path is not None and not path.keep_cache:
            self.engine.release()

    @torch.no_grad()
    def generate(
        self, keys: list[Hashable], sequences: list[list[int]], params: SamplingParams
    ) -> RolloutBatch:
        """One turn: a response for each ``sequences[i]`` (its full token ids: prompt and
        all earlier turns), sample ``keys[i]`` keeping its cache row for the next turn.
        Keys absent from this call are dropped. ``params.n`` must be 1."""
        if params.n != 1 or len(keys) != len(sequences) or len(set(keys)) != len(keys):
            raise ValueError("a session turn takes n=1 and one distinct key per sequence")
        if not sequences or any(len(s) == 0 for s in sequences):
            raise UserError("a prompt has no tokens", where="rollout", fix="drop empty prompts")
        self._used = True
        if len(sequences) > self.engine.max_batch:  # several decode batches: no reuse
            self.held = {}
            self.stats["prefill_tokens"] += sum(len(s) for s in sequences)
            toks, lps = self.engine.sample(
                self.model, sequences, params, self.eos_ids, self.pad_id, self.generator
            )
        else:
            toks, lps = self._turn(keys, sequences, params)
        return finish_batch(
            sequences,
            toks,
            1,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            max_new_tokens=params.max_new_tokens,
            logprobs=lps,
        )

    def _turn(self, keys, seqs: list[list[int]], params: SamplingParams):
        eng = self.engine
        root, w, graphs = eng._prepare(self.model, self.generator)
        held = self.held if eng._owner is self else {}
        eng._owner, self.held = None, {}  # until this turn has finished
        dev = eng._spec.device
        # 1. match
        reuse = [
            min(common_prefix(held[k].tokens, s), len(s) - 1) if k in held else 0
            for k, s in zip(keys, seqs)
        ]
        lens = [len(s) for s in seqs]
        plen, rows = max(lens), len(seqs)
        t = -(-(plen + max(params.max_new_tokens, 3)) // eng.seq_round) * eng.seq_round
        st, key, k, v = eng._slots_for(
            root, rows, t, params, self.eos_ids, self.pad_id, graphs, keep=any(reuse)
        )
        start = [plen - n for n in lens]
        # 2. relayout
        if any(reuse):
            src = [held[key_].row if r else 0 for key_, r in zip(keys, reuse)]
            offset = [held[key_].start - s if r else 0 for key_, r, s in zip(keys, reuse, start)]
            _relayout(eng._k, eng._v, src, offset, plen)  # whole cache: rows may leave b
            logits = self._extend(w, k, v, seqs, reuse, start, plen)  # 3.
        else:  # nothing cached (the first turn): prefill each distinct sequence once
            logits = self._prefill_distinct(w, k, v, seqs, plen)
        # 4. decode (a graph's warm-up writes a slot >= plen: nothing held there)
        eng._ensure_graph(w, st, key, k, v, graphs, plen, params.max_new_tokens)
        for j in range(0, rows, eng.prefill_batch):  # as FastEngine._run samples them
            r = slice(j, min(rows, j + eng.prefill_batch))
            eng._sample_first(st, key, logits[r], r)
        n_tok = torch.tensor(lens, device=dev)
        toks, lps = eng._decode(w, st, key, k, v, n_tok, plen, params.max_new_tokens, graphs)
        eos = set(self.eos_ids)
        for i, (key_, seq, out) in enumerate(zip(keys, seqs, toks)):
            fed = out[: len(out) - 1]  # the last sampled token was never fed back
            end = next((e + 1 for e, tok in enumerate(fed) if tok in eos), len(fed))
            self.held[key_] = _Held(seq + fed[:end], row=i, start=start[i])
        eng._owner = self
        return toks, lps

    def _extend(self, w, k, v, seqs, reuse, start, plen) -> torch.Tensor:
        """Step 3: prefill row i's tokens after its first ``reuse[i]`` (cached at slots
        ``[start[i], start[i] + reuse[i])``) -> last-position logits (rows, V)."""
        eng, dev = self.engine, self.engine._spec.device
        new = [s[r:] for s, r in zip(seqs, reuse)]
        width = max(len(x) for x in new)  # new tokens of row i at slots [plen - n_i, plen)
        logits = []
        for j in range(0, len(seqs), eng.prefill_batch):
            r = slice(j, j + eng.prefill_batch)
            ids, mask = left_pad(new[r], self.pad_id, width=width, device=dev)
            pos = (torch.tensor(reuse[r], device=dev)[:, None] + mask.cumsum(-1) - 1).clamp_min(0)
            first = torch.tensor(start[r], device=dev)
            args = (eng._cos, eng._sin, k, v, slice(j, j + len(new[r])), plen - width)
            logits.append(extend(w, eng._spec, ids, mask, pos, first, *args))
        self.stats["prefill_tokens"] += sum(len(x) for x in new)
        self.stats["reused_tokens"] += sum(reuse)
        return torch.cat(logits)

    def _prefill_distinct(self, w, k, v, seqs, plen) -> torch.Tensor:
        """Prefill each distinct sequence once into rows ``[0, u)``, then copy row by row
        (the loop's first turn holds ``n`` copies of every prompt) -> logits (rows, V)."""
        eng, dev = self.engine, self.engine._spec.device
        unique, src = distinct(seqs)
        logits = []
        for j in range(0, len(unique), eng.prefill_batch):
            part = unique[j : j + eng.prefill_batch]
            ids, mask = left_pad(part, self.pad_id, width=plen, device=dev)
            r = slice(j, j + len(part))
            logits.append(prefill(w, eng._spec, ids, mask, eng._cos, eng._sin, k, v, r, 1))
        if len(unique) < len(seqs):
            _relayout(eng._k, eng._v, src, [0] * len(seqs), plen)
        done = sum(len(s) for s in unique)
        self.stats["prefill_tokens"] += done
        self.stats["reused_tokens"] += sum(len(s) for s in seqs) - done
        return torch.cat(logits)[torch.tensor(src, device=dev)]


def _relayout(k: torch.Tensor, v: torch.Tensor, src: list[int], offset: list[int], plen: int):
    """Move cache row ``src[i]`` to row i, slot ``s + offset[i]`` to slot s, for slots
    ``[0, plen)`` of rows ``[0, len(src))``; caches ``(layers, B, Hkv, T, D)``. One layer
    at a time, through a gathered copy (source and target may overlap)."""
    dev = k.device
    rows = torch.tensor(src, device=dev)[:, None]  # (b, 1)
    slots = torch.arange(plen, device=dev)[None] + torch.tensor(offset, device=dev)[:, None]
    slots = slots.clamp(0, k.shape[3] - 1)  # (b, plen); out-of-range slots are padding
    for cache in (k, v):
        for layer in cache:  # (B, Hkv, T, D)
            moved = layer[rows, :, slots]  # (b, plen, Hkv, D)
            layer[: len(src), :, :plen] = moved.transpose(1, 2)
