"""The HF rollout samples exactly danka's distribution, whatever the model's generation_config
says (issue 11 #7: Qwen2-Instruct ships repetition_penalty 1.05 and top_k 20)."""

from __future__ import annotations

import torch

from danka.models.tiny import tiny_causal_lm
from danka.rollout.base import SamplingParams, build_engine
from danka.rollout.hf import HFGenerateEngine

PROMPTS = [[5, 6, 7, 8], [20, 21]]
EOS = 3  # not produced by these runs (checked by the greedy reference)


def tiny_with_opinions():
    model = tiny_causal_lm().eval()
    g = model.generation_config
    g.repetition_penalty, g.top_k, g.no_repeat_ngram_size, g.min_p = 50.0, 1, 1, 0.99
    g.temperature, g.do_sample = 0.3, True
    return model


@torch.no_grad()
def manual_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """Plain argmax of the forward: greedy with no logits processor at all."""
    ids = list(prompt)
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_greedy_ignores_models_generation_config():
    model = tiny_with_opinions()
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    out = build_engine("hf").generate(model, PROMPTS, params, eos_ids=[EOS], pad_id=0)
    for i, prompt in enumerate(PROMPTS):
        ref = manual_greedy(model, prompt, 10)
        # a tiny random model repeats tokens: the model's repetition penalty / n-gram ban
        # (inherited by the old engine) would have changed these
        assert len(set(ref)) < len(ref)
        assert out.response_ids[i].tolist() == ref
    assert model.generation_config.repetition_penalty == 50.0  # restored afterwards


def test_sampling_does_not_inherit_top_k_or_min_p():
    model = tiny_with_opinions()
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=1)
    torch.manual_seed(1)
    out = build_engine("hf").generate(model, [PROMPTS[0]], params, eos_ids=[EOS], pad_id=0)
    greedy = manual_greedy(model, PROMPTS[0], 1)[0]
    # The model's top_k=1 or min_p=0.99 would make every sample the argmax; temperature 1 over a near
    # flat tiny-model distribution gives several distinct first tokens out of 16.
    assert len(set(out.response_ids[:, 0].tolist()) - {greedy}) >= 2


def test_sampling_config_is_exactly_danka_settings():
    from danka.rollout.hf import sampling_config

    cfg = sampling_config(SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=0), [2], 0)
    assert (cfg.temperature, cfg.top_p, cfg.top_k) == (0.7, 0.9, 0)
    assert cfg.repetition_penalty == 1.0 and cfg.do_sample and cfg.num_return_sequences == 4


def test_halve_batch_stops_at_one_group():
    # 16 sequences in groups of 4: 16 -> 8 -> 4, then a call holds one group and cannot shrink
    engine = HFGenerateEngine()  # batch_size 0: the whole step in one call
    assert engine.halve_batch(4, 16) == (16, 8) and engine.batch_size == 8
    assert engine.halve_batch(4, 16) == (8, 4)
    assert engine.halve_batch(4, 16) is None and engine.batch_size == 4
    assert HFGenerateEngine(batch_size=6).halve_batch(2, 16) == (6, 2)  # whole groups: 3 -> 2


def test_the_fast_engine_halves_its_decode_batch_and_frees_its_cache():
    from danka.rollout.fast.engine import FastEngine
    from danka.rollout.fast.options import FastOptions

    engine = FastEngine(FastOptions(batch_size=256))
    engine._k = torch.zeros(1)  # stands for a kept KV cache sized to the old batch
    assert engine.halve_batch(4, 64) == (64, 32) and engine.max_batch == 32
    assert engine._k is None  # released: the next call sizes it to 32
    assert FastEngine(FastOptions(batch_size=4)).halve_batch(4, 64) is None
