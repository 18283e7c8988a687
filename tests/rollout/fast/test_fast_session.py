"""FastSession: turns re-use each sample's KV cache and equal FastEngine.generate (CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from danka.rollout.base import SamplingParams
from danka.rollout.fast.engine import FastEngine
from danka.rollout.fast.options import FastExperiments, FastOptions
from danka.rollout.fast.session import FastSession, _relayout, common_prefix
from tests.rollout.fast.test_fast_engine import PROMPTS, tiny

GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
EOS = [299]


def responses(out) -> list[list[int]]:
    return [
        out.response_ids[i][out.response_mask[i].bool()].tolist()
        for i in range(out.response_ids.shape[0])
    ]


def check_turn(session, model, keys, seqs, params=GREEDY, eos=EOS):
    """One session turn, checked against a fresh engine's ``generate`` on the same
    sequences (full prefill); returns the responses."""
    out = session.generate(keys, seqs, params)
    ref = FastEngine(FastOptions(), FastExperiments(seq_round=8)).generate(
        model, seqs, params, eos_ids=eos, pad_id=0
    )
    assert out.response_ids.tolist() == ref.response_ids.tolist()
    torch.testing.assert_close(out.rollout_logprobs, ref.rollout_logprobs, atol=1e-5, rtol=0)
    assert out.prompt_ids.tolist() == ref.prompt_ids.tolist()
    return responses(out)


def tool_tokens(key: int) -> list[int]:
    """1 + 2 * key inserted tokens (a stand-in for a tool response and the next header)."""
    return list(range(100 + key, 101 + 3 * key))


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0


def test_relayout_moves_rows_and_shifts_slots():
    # caches (layers=1, B=3, Hkv=1, T=6, D=1) holding 10 * row + slot
    k = (10 * torch.arange(3)[:, None] + torch.arange(6)[None]).float().view(1, 3, 1, 6, 1)
    v = -k.clone()
    _relayout(k, v, src=[2, 0], offset=[1, -2], plen=4)
    # new row 0, slot s <- old row 2, slot s + 1: 21..24; new row 1, slot s <- old row 0,
    # slot s - 2 (clamped at 0; slots before the prefix are padding): 0, 0, 0, 1
    assert k[0, :2, 0, :4, 0].tolist() == [[21, 22, 23, 24], [0, 0, 0, 1]]
    assert v[0, :2, 0, :4, 0].tolist() == [[-21, -22, -23, -24], [0, 0, 0, -1]]
    assert k[0, 2, 0, :, 0].tolist() == [20, 21, 22, 23, 24, 25]  # row 2 untouched
    assert k[0, 0, 0, 4:, 0].tolist() == [4, 5]  # slots >= plen untouched


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_turns_reuse_the_cache_and_equal_full_prefill(kind):
    model = tiny(kind)
    engine = FastEngine(
        FastOptions(), FastExperiments(seq_round=8)
    )  # small rounding: the cache grows between turns
    session = engine.session(model, eos_ids=EOS, pad_id=0)
    keys, seqs = [0, 1, 2, 3], [list(p) for p in PROMPTS]
    resp = check_turn(session, model, keys, seqs)
    assert session.stats == {"prefill_tokens": 7 + 2 + 4 + 1, "reused_tokens": 0}
    assert all(len(r) == 10 and EOS[0] not in r for r in resp)  # no EOS: all 10 sampled
    cache_before = engine._k.shape

    # Turn 2: every sample continues. Row i holds its prompt and the 9 sampled tokens
    # that were fed back (the 10th never was): reused = (7+9)+(2+9)+(4+9)+(1+9) = 50;
    # prefilled = the 10th token + 1 + 2 * key inserted: (1+1)+(1+3)+(1+5)+(1+7) = 20.
    seqs = [s + r + tool_tokens(k) for k, s, r in zip(keys, seqs, resp)]
    resp = check_turn(session, model, keys, seqs)
    assert session.stats == {"prefill_tokens": 14 + 20, "reused_tokens": 50}
    assert engine._k.shape[3] > cache_before[3]  # grown with its contents kept

    # Turn 3: sample 0 ended (dropped, rows compact); the others come in reverse order.
    # Turn-2 lengths: key 3: 1+10+7 = 18, key 2: 4+10+5 = 19, key 1: 2+10+3 = 15, so
    # reused = (18+9)+(19+9)+(15+9) = 79; prefilled = (1+7)+(1+5)+(1+3) = 18.
    keys, seqs = [3, 2, 1], [s + r + tool_tokens(k) for k, s, r in zip(keys, seqs, resp)][:0:-1]
    assert [len(s) for s in seqs] == [18 + 10 + 7, 19 + 10 + 5, 15 + 10 + 3]
    resp = check_turn(session, model, keys, seqs)
    assert session.stats == {"prefill_tokens": 34 + 18, "reused_tokens": 50 + 79}

    # Turn 4: key 2's sequence was edited at token 3: only its first 3 tokens are reused.
    # reused = (35+9) + 3 + (28+9) = 84; prefilled: key 3: 1+7, key 1: 1+3, key 2: all
    # of 34+10+5 = 49 but the first 3.
    seqs = [s + r + tool_tokens(k) for k, s, r in zip(keys, seqs, resp)]
    seqs[1] = seqs[1][:3] + [7] + seqs[1][4:]
    check_turn(session, model, keys, seqs)
    assert session.stats["reused_tokens"] == 129 + 84
    assert session.stats["prefill_tokens"] == 52 + 8 + (49 - 3) + 4
    session.close()
    assert engine._owner is None and engine._k is None  # freed for the update (keep_cache off)


def test_first_turn_prefills_each_distinct_prompt_once():
    model = tiny("qwen2")
    session = FastEngine().session(model, eos_ids=EOS, pad_id=0)
    keys = [0, 1, 2, 3, 4]  # the loop's first turn: n copies of each prompt
    seqs = [list(PROMPTS[i]) for i in (0, 0, 1, 0, 1)]
    resp = check_turn(session, model, keys, seqs)
    # prefilled: prompt 0 (7) and prompt 1 (2) once; copied: 7 + 2 + 7 = 16
    assert session.stats == {"prefill_tokens": 9, "reused_tokens": 16}
    assert resp[0] == resp[1] == resp[3] and resp[2] == resp[4]
    # every copy is a row of its own: the samples go on with different tool responses
    seqs = [s + r + tool_tokens(k) for k, s, r in zip(keys, seqs, resp)]
    check_turn(session, model, keys, seqs)
    assert session.stats["reused_tokens"] == 16 + (7 + 9) * 3 + (2 + 9) * 2


def test_a_sample_that_emitted_eos_holds_it_once_fed_back():
    model = tiny("llama")
    first = FastEngine().generate(model, PROMPTS, GREEDY, eos_ids=EOS, pad_id=0)
    eos = [first.response_ids[0, 2].item()]  # sample 0 ends at its 3rd token
    session = FastEngine().session(model, eos_ids=eos, pad_id=0)
    keys, seqs = [0, 1, 2, 3], [list(p) for p in PROMPTS]
    resp = check_turn(session, model, keys, seqs, eos=eos)
    assert len(resp[0]) == 3 and resp[0][-1] == eos[0] and len(resp[1]) > 3
    held = session.held[0].tokens
    assert held == seqs[0] + resp[0]  # its EOS was fed (the others kept decoding)
    seqs = [s + r + tool_tokens(k) for k, s, r in zip(keys, seqs, resp)]
    check_turn(session, model, keys, seqs, eos=eos)


def test_sampling_turns_run_and_keep_the_global_rng_in_step():
    model = tiny("llama")
    sampled = SamplingParams(n=1, temperature=1.0, top_k=20, top_p=0.9, max_new_tokens=8)
    seqs = [list(p) for p in PROMPTS]
    torch.manual_seed(3)
    session = FastEngine().session(model, eos_ids=EOS, pad_id=0)
    a = session.generate([0, 1, 2, 3], seqs, sampled)
    seqs2 = [s + r + [50] for s, r in zip(seqs, responses(a))]
    session.generate([0, 1, 2, 3], seqs2, sampled)
    after_session = torch.rand(1)
    torch.manual_seed(3)  # the same two turns through generate draw as many seeds
    engine = FastEngine()
    b = engine.generate(model, seqs, sampled, eos_ids=EOS, pad_id=0)
    assert b.response_ids.tolist() == a.response_ids.tolist()  # turn 1: the same path
    engine.generate(model, seqs2, sampled, eos_ids=EOS, pad_id=0)
    assert torch.rand(1).item() == after_session.item()


def test_more_rows_than_one_decode_batch_fall_back_to_full_prefill():
    model = tiny("llama")
    session = FastEngine(FastOptions(batch_size=3)).session(model, eos_ids=EOS, pad_id=0)
    keys, seqs = [0, 1, 2, 3], [list(p) for p in PROMPTS]
    resp = check_turn(session, model, keys, seqs)
    seqs = [s + r + [60] for s, r in zip(seqs, resp)]
    check_turn(session, model, keys, seqs)
    assert session.stats == {"prefill_tokens": 14 + sum(map(len, seqs)), "reused_tokens": 0}
    check_turn(session, model, keys[1:], seqs[1:])  # 3 rows fit again: nothing held yet
    assert session.stats["reused_tokens"] == 0


def test_another_call_on_the_engine_between_turns_forces_full_prefill():
    model = tiny("llama")
    engine = FastEngine()
    session = engine.session(model, eos_ids=EOS, pad_id=0)
    keys, seqs = [0, 1, 2, 3], [list(p) for p in PROMPTS]
    resp = check_turn(session, model, keys, seqs)
    engine.generate(model, [[9, 9, 9, 9, 9, 9, 9, 9, 9]], GREEDY, eos_ids=EOS, pad_id=0)
    seqs = [s + r + [60] for s, r in zip(seqs, resp)]
    check_turn(session, model, keys, seqs)  # overwritten cache: nothing re-used
    assert session.stats["reused_tokens"] == 0


def test_keep_cache_false_keeps_it_for_the_session_and_frees_it_on_close():
    model = tiny("qwen2")
    engine = FastEngine(FastOptions(keep_cache=False))
    session = engine.session(model, eos_ids=EOS, pad_id=0)
    keys, seqs = [0, 1], [list(p) for p in PROMPTS[:2]]
    resp = check_turn(session, model, keys, seqs)
    assert engine._k is not None  # kept between the turns
    check_turn(session, model, keys, [s + r + [61] for s, r in zip(seqs, resp)])
    assert session.stats["reused_tokens"] == (7 + 9) + (2 + 9)
    session.close()
    assert engine._k is None and not engine._owned.buf


def test_bad_calls():
    model = tiny("llama")
    session = FastEngine().session(model, eos_ids=EOS, pad_id=0)
    with pytest.raises(ValueError, match="n=1"):
        session.generate([0, 0], [[1], [2]], GREEDY)
    with pytest.raises(ValueError, match="n=1"):
        session.generate([0], [[1]], SamplingParams(n=2, max_new_tokens=3))
    from danka.errors import UserError

    with pytest.raises(UserError, match="no tokens"):
        session.generate([0], [[]], GREEDY)
    with pytest.raises(UserError, match="at most 16"):
        FastSession(FastEngine(), model, eos_ids=list(range(17)), pad_id=0)
    fake = torch.nn.Linear(2, 2)
    fake.config = SimpleNamespace(model_type="gpt2")
    session = FastEngine().session(fake, eos_ids=EOS, pad_id=0)
    with pytest.raises(UserError, match="gpt2"):
        session.generate([0], [[1]], GREEDY)
    session.close()  # after a failed turn: no error of its own


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_session_with_cuda_graphs_equals_eager_generate():
    model = tiny("qwen2").cuda()
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=40)
    engine = FastEngine(FastOptions(), FastExperiments(use_cuda_graph=True))
    session = engine.session(model, eos_ids=EOS, pad_id=0)
    keys, seqs = [0, 1, 2, 3], [list(p) for p in PROMPTS]
    for turn in range(3):
        out = session.generate(keys, seqs, params)
        ref = FastEngine(FastOptions(), FastExperiments(use_cuda_graph=False)).generate(
            model, seqs, params, eos_ids=EOS, pad_id=0
        )
        assert out.response_ids.tolist() == ref.response_ids.tolist(), turn
        torch.testing.assert_close(out.rollout_logprobs, ref.rollout_logprobs)
        drop = turn % 2  # drop sample 0 after the second turn (its key and its sequence)
        keys, seqs, resp = keys[drop:], seqs[drop:], responses(out)[drop:]
        seqs = [s + r + tool_tokens(k) for k, s, r in zip(keys, seqs, resp)]
    # turns 2 and 3 re-use each kept sample's prompt and fed-back tokens
    assert session.stats["reused_tokens"] > session.stats["prefill_tokens"]
    session.close()
