"""The vllm rollout engine on a CPU, with a fake ``vllm`` module (tests/rollout/vllm/fake_vllm.py)
that builds its own model from the config alone: only the weight sync makes it generate
like the policy. Checked: the RolloutBatch is the HF engine's for the same (greedy) tokens,
EOS and grouping included; after an optimiser step exactly the changed tensors (full), the
merged adapted weights (LoRA merge) or a fresh adapter (LoRA adapter) reach the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from danka.models.lora import apply_lora
from danka.models.tiny import tiny_causal_lm, tiny_tokenizer
from danka.rollout.base import SamplingParams
from danka.rollout.hf import HFGenerateEngine
from danka.rollout.vllm.engine import VllmEngine
from tests.rollout.vllm import fake_vllm

PROMPTS = [[5, 9, 11, 3], [7, 8], [12, 13, 14, 15, 16, 6]]
GREEDY = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def fake(monkeypatch):
    yield fake_vllm.install(monkeypatch)
    for engine in ENGINES:  # the optimiser hook and temp folders of every engine made
        engine.release()
    ENGINES.clear()


ENGINES: list[VllmEngine] = []


def vllm_engine(**kw) -> VllmEngine:
    ENGINES.append(VllmEngine(**kw))
    return ENGINES[-1]


def policy(seed: int = 0) -> torch.nn.Module:
    return tiny_causal_lm(tiny_tokenizer(), arch="qwen2", seed=seed).float()


def lora_policy(seed: int = 0) -> torch.nn.Module:
    model = apply_lora(policy(seed), r=4, alpha=8, dropout=0.0, target_modules=TARGETS)
    with torch.no_grad():  # a live adapter: B != 0 changes the tokens
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    return model


def run(engine, model, params=GREEDY, eos=()):
    return engine.generate(model, PROMPTS, params, eos_ids=list(eos), pad_id=0)


def same_batch(a, b) -> None:
    for f in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_index"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert torch.equal(a.truncated, b.truncated)


def step(model, params=None, lr=0.05) -> None:
    """One AdamW step (fused: updates in place without bumping ``_version``)."""
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    opt = torch.optim.AdamW(params, lr=lr, fused=True)
    ids = torch.tensor([PROMPTS[0] + PROMPTS[1]])
    model(input_ids=ids).logits.float().square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def hf_names(model) -> set[str]:
    return {n for n, _ in model.named_parameters()}


def test_batch_is_the_hf_engines_for_the_same_tokens_eos_and_groups(fake):
    model = policy()
    hf = HFGenerateEngine()
    free = run(hf, model)
    eos = int(free.response_ids[0, 2])  # a token the first prompt's answer reaches at step 3
    want = run(hf, model, eos=[eos])
    assert want.truncated.any() or not want.truncated.all()
    engine = vllm_engine()
    got = run(engine, model, eos=[eos])
    same_batch(got, want)
    assert got.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert not got.truncated[0] and int(got.response_mask[0].sum()) <= 3  # cut after its EOS
    assert got.rollout_logprobs.shape == got.response_ids.shape
    assert torch.all(got.rollout_logprobs[got.response_mask == 0] == 0)
    assert torch.all(got.rollout_logprobs[got.response_mask == 1] <= 0)
    llm = fake.LLM.instances[0]
    assert llm.kwargs["load_format"] == "dummy" and llm.kwargs["skip_tokenizer_init"]
    assert llm.kwargs["max_num_seqs"] == len(PROMPTS) * GREEDY.n
    assert llm.kwargs["max_model_len"] == 6 + 8  # longest prompt + new tokens
    assert "enable_lora" not in llm.kwargs
    config = json.loads((Path(engine.spec.model) / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]  # vLLM picks its model class by it


def test_sampled_groups_and_logprobs(fake):
    model = policy()
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=5)
    batch = run(vllm_engine(), model, params, eos=[1])
    assert batch.size == 9 and batch.group_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert torch.equal(batch.prompt_ids[0], batch.prompt_ids[2])  # a group shares its prompt
    ended = (batch.response_ids == 1).any(1)
    assert torch.equal(batch.truncated, ~ended)
    assert torch.all(batch.response_mask.sum(1)[batch.truncated] == 5)


def test_full_sync_sends_exactly_the_changed_tensors(fake):
    model = policy()
    model.model.embed_tokens.weight.requires_grad_(False)  # frozen: sent once
    skipped = model.model.layers[1].mlp.down_proj.weight  # trainable, never stepped
    engine = vllm_engine(keep_cache=True)  # awake: only what changed is sent
    run(engine, model)
    llm = fake.LLM.instances[0]
    assert set(llm.loaded.weights[0]) == hf_names(model)  # first sync: everything
    resets = llm.loaded.resets
    stepped = [p for p in model.parameters() if p.requires_grad and p is not skipped]
    step(model, stepped)
    got = run(engine, model)
    names = {n for n, p in model.named_parameters() if any(p is q for q in stepped)}
    assert set(llm.loaded.weights[1]) == names  # no embedding, no down_proj of layer 1
    assert llm.loaded.resets == resets + 1  # prefix cache dropped after the change
    same_batch(got, run(HFGenerateEngine(), model))  # the engine follows the policy
    run(engine, model)  # nothing changed: nothing sent
    assert len(llm.loaded.weights) == 2 and llm.loaded.resets == resets + 1
    with torch.no_grad():  # a checkpoint loaded into a frozen tensor (bumps _version)
        model.model.embed_tokens.weight.mul_(1.5)
    run(engine, model)
    assert llm.loaded.weights[2] == ["model.embed_tokens.weight"]


def test_lora_merge_sends_merged_weights_of_the_adapted_modules(fake):
    model = lora_policy()
    engine = vllm_engine(keep_cache=True)  # lora_compute auto = merge on a 32-bit base
    got = run(engine, model)
    same_batch(got, run(HFGenerateEngine(), model))
    llm = fake.LLM.instances[0]
    first = set(llm.loaded.weights[0])
    base = policy()
    assert first == hf_names(base)  # HF names only: no lora_, no base_layer
    step(model)  # the adapters' A and B move
    got = run(engine, model)
    adapted = {f"model.layers.{i}.{blk}.{t}.weight" for i in range(2) for t in TARGETS
               for blk in (("self_attn",) if t[0] in "qkvo" else ("mlp",))}  # fmt: skip
    assert set(llm.loaded.weights[1]) == adapted
    same_batch(got, run(HFGenerateEngine(), model))
    assert "enable_lora" not in llm.kwargs


def test_lora_adapter_mode_sends_a_fresh_adapter_after_each_step(fake):
    model = lora_policy()
    engine = vllm_engine(lora_mode="adapter", keep_cache=True)
    got = run(engine, model)
    llm = fake.LLM.instances[0]
    assert llm.kwargs["enable_lora"] and llm.kwargs["max_lora_rank"] == 8  # r 4 -> vLLM's 8
    assert set(llm.loaded.weights[0]) == hf_names(policy())  # the base, once
    same_batch(got, run(HFGenerateEngine(), model))
    first = llm.loaded.adapters[0]
    step(model)
    got = run(engine, model)
    assert len(llm.loaded.weights) == 1  # the frozen base is not sent again
    second = llm.loaded.adapters[1]
    assert second.lora_int_id == first.lora_int_id + 1 and second.lora_path != first.lora_path
    same_batch(got, run(HFGenerateEngine(), model))
    engine.release()
    assert engine.calls is None


@pytest.mark.parametrize("keep_cache", [None, False])
def test_sleeping_between_rollouts_sends_everything_again(fake, keep_cache):
    """rollout.keep_cache null (the default) or false: vLLM sleeps (level 2) after each
    generate, so the next call wakes the weights, sends all of them again (nothing changed
    here, yet the engine lost them), wakes the KV cache and only then generates."""
    model = policy()
    engine = vllm_engine(keep_cache=keep_cache)
    first = run(engine, model)
    llm = fake.LLM.instances[0]
    assert llm.kwargs["enable_sleep_mode"] is True
    assert llm.loaded.calls == ["generate", "sleep 2"]
    again = run(engine, model)  # no optimiser step in between
    assert llm.loaded.calls[2:] == ["wake weights", "wake kv_cache", "generate", "sleep 2"]
    assert set(llm.loaded.weights[1]) == hf_names(model)  # all again, not "nothing changed"
    same_batch(again, first)
    same_batch(again, run(HFGenerateEngine(), model))


def test_sleeping_adapter_mode_loads_the_adapter_again(fake):
    model = lora_policy()
    engine = vllm_engine(lora_mode="adapter", keep_cache=False)
    run(engine, model)
    got = run(engine, model)
    llm = fake.LLM.instances[0]
    assert [a.lora_int_id for a in llm.loaded.adapters] == [1, 2]  # a fresh id after waking
    same_batch(got, run(HFGenerateEngine(), model))


def test_keep_cache_true_keeps_vllm_awake(fake):
    model = policy()
    engine = vllm_engine(keep_cache=True)
    run(engine, model)
    run(engine, model)
    llm = fake.LLM.instances[0]
    assert llm.kwargs["enable_sleep_mode"] is False
    assert llm.loaded.calls == ["generate", "generate"]
    assert llm.loaded.weights[1:] == []  # nothing changed, nothing sent


def test_lora_compute_base_is_refused():
    from danka.errors import UserError

    with pytest.raises(UserError, match="lora_compute"):
        VllmEngine(lora_mode="base")


def test_base_weights_go_under_base_layer_where_vllm_wrapped_the_linear():
    from danka.rollout.vllm.calls import lora_base_names

    t = torch.zeros(1)
    names = {  # vLLM's own names with enable_lora (packed q/k/v, gate/up; lm_head wrapped)
        "model.layers.0.self_attn.qkv_proj.base_layer.weight",
        "model.layers.0.self_attn.qkv_proj.base_layer.bias",
        "model.layers.0.mlp.down_proj.base_layer.weight",
        "model.layers.0.input_layernorm.weight",
        "lm_head.base_layer.weight",
    }
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    pairs = [(n, t) for n in ("model.layers.0.self_attn.k_proj.bias",
                              "model.layers.0.mlp.down_proj.weight",
                              "model.layers.0.input_layernorm.weight", "lm_head.weight",
                              "model.layers.0.mlp.up_proj.weight")]  # fmt: skip
    assert [n for n, _ in lora_base_names(pairs, names, packed)] == [
        "model.layers.0.self_attn.k_proj.base_layer.bias",  # vLLM packs it into qkv_proj
        "model.layers.0.mlp.down_proj.base_layer.weight",
        "model.layers.0.input_layernorm.weight",  # not wrapped: as it was
        "lm_head.base_layer.weight",
        "model.layers.0.mlp.up_proj.weight",  # gate_up_proj not wrapped here: as it was
    ]


def test_batched_tokens_never_spread_past_the_sequences_block_tables():
    from danka.rollout.vllm.calls import VllmSpec, batched_tokens

    # the GPU test's engine: 8 prompts x 4 samples, 5 + 32 tokens: 32 x 37 = 1184, not 8192
    # (8192 over 32 dummy requests = 256 tokens each, past a 37-token block table)
    assert batched_tokens(32, 37) == 1184
    assert batched_tokens(512, 768) == 8192  # the GSM8K example: vLLM's chunk as before
    assert batched_tokens(1, 9000) == 9000  # one sequence longer than the chunk: it fits
    spec = VllmSpec(model="m", dtype="bfloat16", gpu_memory_utilization=0.1,
                    max_model_len=37, max_num_seqs=32, seed=0)  # fmt: skip
    assert spec.llm_kwargs()["max_num_batched_tokens"] == 1184


def test_vllm_in_danka_rollout_vllm_is_the_library(monkeypatch):
    """The engine's package is danka.rollout.vllm, its tests' tests/rollout/vllm: neither
    shadows the library, as imports are absolute (the fake here, or nothing, is ``vllm``)."""
    import importlib.util
    import sys

    import danka.rollout.vllm
    from danka.rollout.vllm.calls import import_vllm

    fake = fake_vllm.install(monkeypatch)
    assert import_vllm() is fake is sys.modules["vllm"]
    monkeypatch.delitem(sys.modules, "vllm")
    spec = importlib.util.find_spec("vllm")  # None here; the library where it is installed
    found = [spec.origin, *(spec.submodule_search_locations or [])] if spec else []
    where = {Path(p).resolve() for p in found if p}
    ours = {Path(danka.rollout.vllm.__file__).parent, Path(__file__).parent}
    assert not {p for p in where for d in ours if p == d or d in p.parents}, where
