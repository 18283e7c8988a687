"""Staged decode: the full-length stage moves its rows to a smaller batch as they finish
(tiny random Llama on CPU: no graphs, exact batch sizes; one test on CUDA with graphs)."""

from __future__ import annotations

import pytest
import torch

from danka.rollout.base import SamplingParams
from danka.rollout.fast.engine import FastEngine
from danka.rollout.fast.options import FastExperiments, FastOptions
from danka.rollout.fast.slots import LayerCache, bucket_size
from danka.rollout.fast.staged import compact_at
from tests.rollout.fast.test_fast_engine import fast_run, tiny

PARAMS = SamplingParams(n=2, temperature=0.0, max_new_tokens=32)
# The tiny Llama's greedy answers to PROMPTS (each twice, n=2) first hold token 7 at steps
# 30, 23, 21 and 11: as an end token it stops the rows (0, 1), (2, 3), (4, 5), (6, 7) there.
EOS = 7
ENDS = [30, 30, 23, 23, 21, 21, 11, 11]


def full_cache(model, eos) -> object:
    """One full-size cache, never staged (keep_cache=True): the reference."""
    return fast_run(model, PARAMS, FastEngine(FastOptions(keep_cache=True)), eos=eos)


def staged(check_every: int) -> FastEngine:
    """Stage 1: prompt (7) + 4 tokens -> 16 slots; full length: 7 + 32 -> 40 slots."""
    return FastEngine(
        FastOptions(), FastExperiments(first_stage=4, seq_round=8, check_every=check_every)
    )


def moves(model, engine, eos) -> list[tuple[list[int], int, int, int]]:
    """Each move of the keys' cache in one call: (stage rows moved, slots copied, new batch
    rows, new capacity)."""
    seen = []
    real = LayerCache.moved

    def spy(self, rows, length, shape):
        seen.append((rows.tolist(), length, shape[0], shape[2]))
        return real(self, rows, length, shape)

    LayerCache.moved = spy
    try:
        fast_run(model, PARAMS, engine, eos=eos)
    finally:
        LayerCache.moved = real
    return seen[::2]  # k, then v, at every move


def test_the_end_token_stops_the_rows_at_different_steps():
    """The premise of the tests below."""
    probe = full_cache(tiny("llama"), ())
    assert [row.index(EOS) for row in probe.response_ids.tolist()] == ENDS


@pytest.mark.parametrize("check_every", [1, 2, 3])
def test_compacted_decode_gives_the_tokens_of_one_full_cache(check_every):
    """Rows finishing at 11, 21, 23, 30: after the stage move (8 rows), 4 then 2 rows go on,
    each time at most half the batch: two compactions, the same greedy tokens and
    log-probs as one full cache, each output row in its own place."""
    model = tiny("llama")
    full = full_cache(model, (EOS,))
    engine = staged(check_every)
    out = fast_run(model, PARAMS, engine, eos=(EOS,))
    assert engine.stats["compactions"] == 2
    assert out.response_mask.sum(1).tolist() == [e + 1 for e in ENDS]
    assert out.response_ids.tolist() == full.response_ids.tolist()
    assert out.response_mask.tolist() == full.response_mask.tolist()
    torch.testing.assert_close(out.rollout_logprobs, full.rollout_logprobs, atol=1e-5, rtol=0)
    assert engine._k is None and engine._slots == {}  # nothing kept after the call


@pytest.mark.parametrize(
    ("check_every", "expected"),
    [
        # stage 1 is full after step 9 (7 + 9 = 16 slots): all 8 rows move to 40 slots.
        # Checks at even steps: 4 rows go on after step 22 (4 <= 8 // 2), 2 after 24
        # (2 <= 4 // 2); at 30 all have finished.
        (2, [(list(range(8)), 16, 8, 40), ([0, 1, 2, 3], 29, 4, 40), ([0, 1], 31, 2, 40)]),
        # Checks at 12, 16, 20 find 6 rows (> 8 // 2); at 24 two: 8 rows -> 2 at once.
        (4, [(list(range(8)), 16, 8, 40), ([0, 1], 31, 2, 40)]),
    ],
)
def test_the_batch_halves_or_more_as_rows_finish(check_every, expected):
    engine = staged(check_every)
    assert moves(tiny("llama"), engine, (EOS,)) == expected
    assert engine.stats["compactions"] == len(expected) - 1


def test_no_compaction_when_no_row_finishes():
    """An end token no answer holds: one move (the stage's, every row), the full cache's
    tokens."""
    model = tiny("llama")
    probe = full_cache(model, ())
    eos = min(set(range(300)) - set(probe.response_ids.flatten().tolist()))
    engine = staged(1)
    assert moves(model, engine, (eos,)) == [(list(range(8)), 16, 8, 40)]
    assert engine.stats["compactions"] == 0
    out = fast_run(model, PARAMS, engine, eos=(eos,))
    assert out.truncated.all()
    assert out.response_ids.tolist() == probe.response_ids.tolist()
    torch.testing.assert_close(out.rollout_logprobs, probe.rollout_logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("graphs", [False, True])
def test_compact_at_is_the_most_rows_that_fit_half_the_batch(graphs):
    """The rule, ``bucket_size(alive) <= b // 2``, counted out for every batch size."""
    for b in [*range(1, 40), 64, 128, 255, 256, 300, 512, 768, 1024, 1280]:
        fit = [a for a in range(b + 1) if bucket_size(a, graphs) <= b // 2]
        assert compact_at(b, graphs) == max(fit, default=0), b
    assert [compact_at(b, True) for b in (8, 16, 256, 512, 768)] == [0, 8, 128, 256, 256]


@pytest.mark.gpu
def test_compaction_with_cuda_graphs_gives_the_tokens_of_one_full_cache():
    """With graphs (buckets of 8 or more rows) 16 rows move to 8 once 8 or fewer go on; the
    moved rows' step is captured again and replays the tokens of one full cache."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny("llama").cuda()
    params = SamplingParams(n=4, temperature=0.0, max_new_tokens=32)
    keep = FastExperiments(use_cuda_graph=True)
    probe = fast_run(model, params, FastEngine(FastOptions(keep_cache=True), keep), eos=())
    rows = probe.response_ids.tolist()

    def compacts(tok: int) -> bool:
        """More than 8 rows go on after step 9 (stage 1 full: a batch of 16), 1 to 8 after
        a check of the full-length stage (an even step)."""
        ends = [r.index(tok) if tok in r else len(r) for r in rows]
        alive = [sum(e > s for e in ends) for s in range(9, 31)]
        return alive[0] > 8 and any(0 < a <= 8 for a in alive[1::2])

    eos = next(t for t in range(300) if compacts(t))
    full = fast_run(model, params, FastEngine(FastOptions(keep_cache=True), keep), eos=(eos,))
    engine = FastEngine(
        FastOptions(),
        FastExperiments(use_cuda_graph=True, first_stage=4, seq_round=8, check_every=2),
    )
    out = fast_run(model, params, engine, eos=(eos,))
    assert engine.stats["compactions"] >= 1
    assert out.response_ids.tolist() == full.response_ids.tolist()
    torch.testing.assert_close(out.rollout_logprobs, full.rollout_logprobs, atol=1e-4, rtol=0)
