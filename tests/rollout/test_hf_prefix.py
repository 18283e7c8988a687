"""Shared-prefix prefill (danka/rollout/hf_prefix.py): the HF engine giving generate's own
tokens with it, greedy and sampled, plain and with LoRA adapters."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from danka.models.prefix import usable
from danka.models.tiny import tiny_causal_lm
from danka.rollout import hf as hf_engine
from danka.rollout.base import SamplingParams, build_engine

# A "system turn" 1..6 shared by all prompts, then per-prompt tokens of different lengths.
SYSTEM = [11, 12, 13, 14, 15, 16]
PROMPTS = [SYSTEM + [20, 21, 22], SYSTEM + [30], SYSTEM + [40, 41, 42, 43, 44]]
EOS, PAD = 3, 0


def _generate(model, prompts, params, *, prefix: bool, seed: int = 1):
    torch.manual_seed(seed)
    with mock.patch.object(hf_engine, "prefix_usable", lambda m: prefix):
        out = build_engine("hf").generate(model, prompts, params, eos_ids=[EOS], pad_id=PAD)
    return out.response_ids


@torch.no_grad()
def manual_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """argmax of a plain forward over the unpadded prompt, token by token."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    return Qwen3ForCausalLM(cfg)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "llama-eager"])
def test_greedy_equals_generate_and_a_plain_forward(arch):
    model = tiny_qwen3() if arch == "qwen3" else tiny_causal_lm(arch=arch.split("-")[0])
    if arch.endswith("eager"):
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"
    model.eval()
    assert usable(model)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    with_prefix = _generate(model, PROMPTS, params, prefix=True)
    assert torch.equal(with_prefix, _generate(model, PROMPTS, params, prefix=False))
    for i, prompt in enumerate(PROMPTS):  # rows i * n + j answer prompt i
        ref = manual_greedy(model, prompt, 8)
        ref = ref[: ref.index(EOS) + 1] if EOS in ref else ref
        assert with_prefix[2 * i, : len(ref)].tolist() == ref
        assert torch.equal(with_prefix[2 * i], with_prefix[2 * i + 1])


def test_sampling_with_lora_draws_the_same_tokens_as_plain_generate():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_causal_lm(),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]),
    )
    for name, p in model.named_parameters():  # a live, non-zero adapter
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    model.eval()
    assert usable(model)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)
    a = _generate(model, PROMPTS, params, prefix=True, seed=7)
    b = _generate(model, PROMPTS, params, prefix=False, seed=7)
    assert a.shape == (12, 6) and torch.equal(a, b)
    # samples of a group differ (the cache copies are not one shared sample)
    assert len({tuple(r) for r in a[:4].tolist()}) > 1


def test_unchecked_attention_keeps_plain_generate():
    model = tiny_causal_lm()
    model.config._attn_implementation = "flash_attention_2"  # not run: only the gate
    assert not usable(model)
    model.config._attn_implementation = "eager"
    assert usable(model)


def test_other_architectures_keep_plain_generate():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64))
    assert not usable(gpt2)
    out = build_engine("hf").generate(
        gpt2.eval(), [[1, 2, 3], [1, 2]], SamplingParams(n=1, temperature=0.0, max_new_tokens=3),
        eos_ids=[EOS], pad_id=PAD,
    )  # fmt: skip
    assert out.response_ids.shape[0] == 2


def test_not_under_torch_distributed(tmp_path):
    # FSDP2 gathers sharded weights in the model's own forward, which prefill bypasses
    import torch.distributed as dist

    model = tiny_causal_lm()
    assert usable(model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        assert not usable(model)
    finally:
        dist.destroy_process_group()
