"""The fast engine against HF generate/forward on tiny random Llama and Qwen2 models (CPU)."""

from __future__ import annotations

import math
import shutil
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from danka.errors import UserError
from danka.rollout.base import EngineOptions, SamplingParams, build_engine
from danka.rollout.fast.engine import FastEngine, bucket_size
from danka.rollout.fast.options import FastExperiments, FastOptions
from danka.rollout.fast.sampling import sample_next
from danka.types import RolloutBatch

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33], [40]]
DIMS = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.2,  # larger than default so greedy outputs are not one repeated token
)


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**DIMS, rope_theta=500.0, rms_norm_eps=1e-5))
    else:  # Qwen2: q/k/v biases, tied embeddings (or, as the 0.5B Coder, its own output
        # head: "qwen2-untied"), its own rope_theta and eps
        tied = kind == "qwen2"
        cfg = Qwen2Config(**DIMS, tie_word_embeddings=tied, rope_theta=2000.0, rms_norm_eps=1e-6)
        model = Qwen2ForCausalLM(cfg)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0.0, 0.5)
        assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    return model.eval()


def hf_greedy(model, prompts, max_new=12, eos=(299,)) -> RolloutBatch:
    # HF generate refuses greedy with num_return_sequences > 1, so n = 1 here.
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new)
    return build_engine("hf").generate(model, prompts, params, eos_ids=list(eos), pad_id=0)


def fast_run(model, params, engine=None, eos=(299,), **kw) -> RolloutBatch:
    engine = engine or FastEngine()
    return engine.generate(model, PROMPTS, params, eos_ids=list(eos), pad_id=0, **kw)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen2-untied"])
def test_greedy_equals_hf_generate_left_padded_n2(kind):
    model = tiny(kind)
    out = fast_run(model, SamplingParams(n=2, temperature=0.0, max_new_tokens=12))
    ref = hf_greedy(model, PROMPTS)
    assert len(set(ref.response_ids.flatten().tolist())) > 4  # a non-degenerate reference
    # Sample i * n + j answers prompt i; both of a greedy pair equal HF's answer.
    torch.testing.assert_close(out.response_ids, ref.response_ids.repeat_interleave(2, 0))
    assert out.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    torch.testing.assert_close(out.prompt_ids, ref.prompt_ids.repeat_interleave(2, 0))


def test_lora_live_weights_no_stale_copy():
    from peft import LoraConfig, get_peft_model

    base = tiny("llama")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)  # peft initialises B to zero; make the adapter matter
    before = {k: v.clone() for k, v in base.state_dict().items() if "lora" not in k}
    engine = FastEngine()
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    out1 = fast_run(model, greedy, engine)
    ref1 = hf_greedy(model, PROMPTS, max_new=10)
    torch.testing.assert_close(out1.response_ids, ref1.response_ids)
    with model.disable_adapter():
        plain = hf_greedy(model, PROMPTS, max_new=10)
    assert not torch.equal(plain.response_ids, ref1.response_ids)  # the adapter changes tokens

    # An "optimizer step" on the adapter: the next call must use the new weights.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.3)
    out2 = fast_run(model, greedy, engine)
    ref2 = hf_greedy(model, PROMPTS, max_new=10)
    torch.testing.assert_close(out2.response_ids, ref2.response_ids)
    assert not torch.equal(out2.response_ids, out1.response_ids)
    # Nothing merged into the base weights.
    after = {k: v for k, v in base.state_dict().items() if "lora" not in k}
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_full_finetune_step_is_seen_by_the_next_call():
    model = tiny("llama")
    engine = FastEngine()
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    out1 = fast_run(model, greedy, engine)
    with torch.no_grad():  # in-place, like an optimizer step; touches a live (unfused) weight
        model.model.layers[1].mlp.down_proj.weight.add_(0.5)
        model.model.layers[0].self_attn.q_proj.weight.mul_(-1.0)
    out2 = fast_run(model, greedy, engine)
    torch.testing.assert_close(out2.response_ids, hf_greedy(model, PROMPTS, max_new=8).response_ids)
    assert not torch.equal(out1.response_ids, out2.response_ids)


def test_eos_stops_and_masks():
    model = tiny("llama")
    free = fast_run(model, SamplingParams(n=1, temperature=0.0, max_new_tokens=10), eos=[])
    seq0 = free.response_ids[0].tolist()
    eos = seq0[3]
    first = seq0.index(eos)  # 3, or earlier if the token repeats
    engine = FastEngine(FastOptions(), FastExperiments(check_every=1))
    out = fast_run(
        model, SamplingParams(n=1, temperature=0.0, max_new_tokens=10), engine, eos=[eos]
    )
    for k, row in enumerate(free.response_ids.tolist()):
        cut = row.index(eos) + 1 if eos in row else len(row)
        assert out.response_ids[k, :cut].tolist() == row[:cut]
        assert out.response_mask[k].tolist() == [1.0] * cut + [0.0] * (
            out.response_ids.shape[1] - cut
        )
        assert bool(out.truncated[k]) == (eos not in row)
        assert (out.response_ids[k, cut:] == 0).all()  # right-padded with pad_id
    assert out.response_mask[0].sum().item() == first + 1
    assert not out.truncated[0]
    ref = build_engine("hf").generate(
        model,
        PROMPTS,
        SamplingParams(n=1, temperature=0.0, max_new_tokens=10),
        eos_ids=[eos],
        pad_id=0,
    )
    torch.testing.assert_close(out.response_mask, ref.response_mask)
    torch.testing.assert_close(out.truncated, ref.truncated)


def test_all_finished_stops_decoding_early():
    model = tiny("llama")
    free = fast_run(model, SamplingParams(n=1, temperature=0.0, max_new_tokens=4), eos=[])
    eos = sorted({row[1] for row in free.response_ids.tolist()})  # every row ends by token 2
    engine = FastEngine(FastOptions(), FastExperiments(check_every=2))
    out = fast_run(model, SamplingParams(n=1, temperature=0.0, max_new_tokens=50), engine, eos=eos)
    assert not out.truncated.any()
    assert out.response_mask.sum(1).max().item() <= 2
    assert engine.stats["steps"] == 2  # checked after step 2, all done: 2 of 49 steps ran


def test_top_k_1_sampling_equals_greedy():
    model = tiny("qwen2")
    greedy = fast_run(model, SamplingParams(n=2, temperature=0.0, max_new_tokens=10))
    gen = torch.Generator().manual_seed(1)
    sampled = fast_run(
        model, SamplingParams(n=2, temperature=1.0, top_k=1, max_new_tokens=10), generator=gen
    )
    torch.testing.assert_close(sampled.response_ids, greedy.response_ids)


def test_generator_makes_sampling_reproducible():
    model = tiny("llama")
    params = SamplingParams(n=2, temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=10)
    a = fast_run(model, params, generator=torch.Generator().manual_seed(7))
    b = fast_run(model, params, generator=torch.Generator().manual_seed(7))
    c = fast_run(model, params, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.parametrize("kind,temperature", [("llama", 1.0), ("qwen2", 0.7), ("llama", 0.0)])
def test_logprobs_match_hf_forward(kind, temperature):
    model = tiny(kind)
    params = SamplingParams(n=2, temperature=temperature, top_p=0.95, max_new_tokens=10)
    out = fast_run(model, params, generator=torch.Generator().manual_seed(3))
    assert out.rollout_logprobs is not None
    ref = forward_logprobs(model, out, temperature)
    torch.testing.assert_close(out.rollout_logprobs, ref, atol=1e-4, rtol=0)


def forward_logprobs(model, out: RolloutBatch, temperature: float) -> torch.Tensor:
    """The training forward's log_softmax(logits / T) of each response token of ``out``
    (0 on padding); greedy (T = 0) reports temperature 1."""
    ids = torch.cat([out.prompt_ids, out.response_ids], 1)
    mask = torch.cat([out.prompt_mask, out.response_mask.long()], 1)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    plen = out.prompt_ids.shape[1]
    # Logits at position plen - 1 + t predict response token t.
    scale = temperature if temperature > 0 else 1.0
    lp = torch.log_softmax(logits[:, plen - 1 : -1].float() / scale, -1)
    return lp.gather(-1, out.response_ids[..., None])[..., 0] * out.response_mask


def test_top_p_keeps_the_nucleus_only():
    # p = [0.5, 0.3, 0.2], top_p = 0.6: mass before token 1 is 0.5 < 0.6 (kept), before
    # token 2 is 0.8 >= 0.6 (dropped); renormalised: P(0) = 0.5 / 0.8 = 0.625.
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]]).repeat(4000, 1)
    torch.manual_seed(0)
    tok, lp = sample_next(
        logits, greedy=False, temperature=torch.tensor(1.0), top_p=torch.tensor(0.6)
    )
    assert set(tok.tolist()) == {0, 1}
    assert abs((tok == 0).float().mean().item() - 0.625) < 0.03  # 4000 draws: sd ~ 0.008
    # Reported log-prob is before filtering: log 0.5 for token 0.
    torch.testing.assert_close(lp[tok == 0], torch.full_like(lp[tok == 0], math.log(0.5)))


def test_unsupported_model_type_names_it_and_the_fallback():
    fake = torch.nn.Linear(2, 2)
    fake.config = SimpleNamespace(model_type="gpt2")
    with pytest.raises(UserError) as err:
        FastEngine().generate(fake, [[1]], SamplingParams(), eos_ids=[0], pad_id=0)
    assert "gpt2" in str(err.value) and "rollout.engine: hf" in str(err.value)


def test_bucket_sizes_and_registry():
    assert [bucket_size(r, True) for r in (1, 8, 9, 64, 65, 256, 300)] == [
        8, 8, 16, 64, 128, 256, 512,
    ]  # fmt: skip
    assert bucket_size(5, False) == 5
    # rollout.generation_batch_size is honoured as the decode batch (max_batch)
    engine = build_engine("fast", EngineOptions(generation_batch_size=4))
    assert isinstance(engine, FastEngine) and engine.max_batch == 4


def test_small_max_batch_splits_and_keep_cache_false():
    model = tiny("llama")
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=6)
    full = fast_run(model, params)
    engine = FastEngine(
        FastOptions(batch_size=3, keep_cache=False)
    )  # 1 prompt (2 samples) per batch
    split = fast_run(model, params, engine)
    torch.testing.assert_close(split.response_ids, full.response_ids)
    assert engine._k is None and not engine._owned.buf  # freed after the call


@pytest.mark.gpu
def test_cuda_graph_replay_equals_eager():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny("qwen2").cuda()
    greedy = SamplingParams(n=3, temperature=0.0, max_new_tokens=40)
    graph_engine = FastEngine(
        FastOptions(keep_cache=True), FastExperiments(use_cuda_graph=True)
    )  # kept: the 2nd call replays
    eager = fast_run(
        model, greedy, FastEngine(FastOptions(), FastExperiments(use_cuda_graph=False))
    )
    graphed = fast_run(model, greedy, graph_engine)
    assert graph_engine.stats["graphs_captured"] == 1
    torch.testing.assert_close(graphed.response_ids, eager.response_ids)
    torch.testing.assert_close(graphed.rollout_logprobs, eager.rollout_logprobs)
    again = fast_run(model, greedy, graph_engine)  # replays the captured graph
    assert graph_engine.stats["graphs_captured"] == 0
    torch.testing.assert_close(again.response_ids, eager.response_ids)
    torch.testing.assert_close(
        graphed.response_ids,
        hf_greedy(model, PROMPTS, max_new=40).response_ids.repeat_interleave(3, 0),
    )
    sampled = SamplingParams(n=3, temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=40)
    s1 = fast_run(model, sampled, graph_engine, generator=torch.Generator("cuda").manual_seed(5))
    s2 = fast_run(model, sampled, graph_engine, generator=torch.Generator("cuda").manual_seed(5))
    torch.testing.assert_close(s1.response_ids, s2.response_ids)


@pytest.mark.gpu
def test_keep_cache_false_frees_everything_between_calls_with_graphs():
    """keep_cache=False re-captures the graphs every call; memory after a call must not
    grow call after call (each capture on a NEW side stream left a 32 MiB cuBLAS workspace
    behind: +0.156 GiB a step in a GRPO run on an H200, 2026-12-01)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny("qwen2").cuda()
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=40)
    engine = FastEngine(
        FastOptions(keep_cache=False, attention="sdpa"), FastExperiments(live_chunk=16)
    )  # 3 graphs a call
    after = []
    for _ in range(4):
        fast_run(model, params, engine, eos=())
        assert engine.stats["graphs_captured"] == 3 and engine._k is None  # released
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
    assert after[3] == after[1], after  # the first call may allocate lasting workspaces


def _lora_layer(hidden=1024, out=64, d=0.0025):
    """A peft LoRA linear: bf16 base with |W| in [1, 2) (bf16 step 2^-7, half-step 0.0039)
    and an fp32 rank-1 adapter whose delta is ``d`` in every entry (below the half-step)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    lin = torch.nn.Sequential()
    lin.add_module("proj", torch.nn.Linear(hidden, out, bias=False))
    with torch.no_grad():
        w = torch.rand(out, hidden) * 0.9 + 1.05  # away from 1 and 2 (other bf16 steps)
        lin.proj.weight.copy_(w * torch.randint(0, 2, w.shape).mul(2).sub(1))
    lin = lin.to(torch.bfloat16)
    model = get_peft_model(lin, LoraConfig(r=1, lora_alpha=1, target_modules=["proj"]))
    layer = model.base_model.model.proj
    with torch.no_grad():
        layer.lora_A["default"].weight.fill_(1.0)
        layer.lora_B["default"].weight.fill_(d)  # delta = 1 * B @ A = d everywhere
    return layer


def test_tiny_lora_delta_is_kept_unmerged_as_in_the_training_forward():
    from danka.rollout.fast.model import _lin
    from danka.rollout.fast.weights import Owned, _fill

    d, hidden = 0.0025, 1024
    layer = _lora_layer(hidden, d=d)
    base_w = layer.base_layer.weight
    assert layer.lora_A["default"].weight.dtype == torch.float32  # peft keeps adapters fp32
    # The old engine merged W + delta into bf16: every entry rounds back to W (all lost).
    assert torch.equal((base_w.float() + d).to(torch.bfloat16), base_w)
    spec = SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cpu"))
    w: dict = {}
    _fill(Owned(), "proj", [layer], spec, False, w)
    assert w["proj"] is base_w  # the live base weight, no copy
    x = torch.ones(3, hidden, dtype=torch.bfloat16)  # the delta adds up coherently: H * d
    with torch.no_grad():
        engine, train = _lin(w, "proj", x), layer(x)
        base = torch.nn.functional.linear(x, base_w)
    torch.testing.assert_close(engine, train, atol=0, rtol=0)  # peft's op order exactly
    shift = (engine.float() - base.float()).mean().item()
    # H * d = 1024 * 0.0025 = 2.56; outputs ~ 48 have a bf16 step of 0.25, so within 0.2
    assert abs(shift - hidden * d) < 0.2


def _lora_delta_cosines(device: str) -> tuple[float, float]:
    """bf16 model, fp32 adapters (peft's default): cosine of the change the adapter makes to
    the next-token log-probs of (engine, HF training forward) with the fp32 change."""
    from peft import LoraConfig, get_peft_model

    from danka.models.unwrap import unwrap_causal_lm
    from danka.rollout.fast.model import prefill, rope_tables
    from danka.rollout.fast.weights import Owned, load_weights, model_spec

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**{**DIMS, "initializer_range": 0.02})).to(device)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=targets)).eval()
    ids = torch.randint(1, 300, (64, 12), device=device)
    mask = torch.ones_like(ids)

    def engine_lp():
        root = unwrap_causal_lm(model)
        spec = model_spec(root)
        w = load_weights(root, spec, Owned())
        cos, sin = rope_tables(root, spec, 16)
        k = torch.zeros(spec.layers, 64, spec.kv_heads, 16, spec.head_dim, dtype=spec.dtype)
        k = k.to(device)
        lp = prefill(w, spec, ids, mask, cos, sin, k, torch.zeros_like(k), slice(0, 64), 1)
        return lp.log_softmax(-1)

    def hf_lp():
        return model(input_ids=ids, attention_mask=mask).logits[:, -1].float().log_softmax(-1)

    with torch.no_grad():
        with model.disable_adapter():
            f0 = hf_lp()
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 3e-3)
        f1 = hf_lp()  # fp32 reference
        model.to(torch.bfloat16)
        for name, p in model.named_parameters():
            if "lora" in name:
                p.data = p.data.float()  # peft's autocast_adapter_dtype: fp32 adapters
        e1, h1 = engine_lp(), hf_lp()
        with model.disable_adapter():
            e0, h0 = engine_lp(), hf_lp()
    ref = f1 - f0

    def cos(a):
        return float((a * ref).sum() / (a.norm() * ref.norm()))

    return cos(e1 - e0), cos(h1 - h0)


def test_lora_delta_changes_engine_logprobs_as_training_forward():
    engine, train = _lora_delta_cosines("cpu")
    assert engine > 0.95 and train > 0.95 and abs(engine - train) < 0.02


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lora_delta_changes_engine_logprobs_as_training_forward_cuda():
    engine, train = _lora_delta_cosines("cuda")
    assert engine > 0.95 and train > 0.95 and abs(engine - train) < 0.02


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("lora_compute", ["adapter", "base"])
def test_lora_engine_logprobs_match_training_forward_with_graphs(lora_compute):
    DEVICE = "cuda"
    """CUDA graphs + unmerged bf16/fp32 LoRA: the engine's sampled-token log-probs equal a
    training forward's to bf16 noise, and a small optimizer-like step on B is seen."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**{**DIMS, "initializer_range": 0.02}))
    base = base.to(DEVICE, torch.bfloat16)
    targets = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=targets)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    assert {p.dtype for n, p in model.named_parameters() if "lora" in n} == {torch.float32}
    engine = FastEngine(
        FastOptions(lora_compute=lora_compute), FastExperiments(use_cuda_graph=DEVICE == "cuda")
    )
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24)
    gen = torch.Generator(DEVICE).manual_seed(0)
    out = engine.generate(model, PROMPTS, params, eos_ids=[299], pad_id=0, generator=gen)
    assert DEVICE == "cpu" or engine.stats["graphs_captured"] >= 1
    ids = torch.cat([out.prompt_ids, out.response_ids], 1).to(DEVICE)
    mask = torch.cat([out.prompt_mask, out.response_mask.long()], 1).to(DEVICE)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    plen = out.prompt_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    lp = torch.log_softmax(logits[:, plen - 1 : -1].float(), -1)
    ref = lp.gather(-1, out.response_ids.to(DEVICE)[..., None])[..., 0].cpu()
    m = out.response_mask.bool()
    gap = (out.rollout_logprobs[m] - ref[m]).abs().mean().item()
    assert gap < 0.05, f"mean |engine - training| log-prob gap {gap:.4f}"


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_unfused_weights_no_copies_same_tokens(kind):
    """fuse_weights=False (the default for big models): q/k/v and gate/up read live, no
    weight buffer is owned, greedy tokens equal HF's (Qwen2: q/k/v biases; with LoRA)."""
    from peft import LoraConfig, get_peft_model

    model = tiny(kind)
    model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    model.eval()
    engine = FastEngine(FastOptions(), FastExperiments(fuse_weights=False))
    out = fast_run(model, SamplingParams(n=1, temperature=0.0, max_new_tokens=10), engine)
    torch.testing.assert_close(out.response_ids, hf_greedy(model, PROMPTS, max_new=10).response_ids)
    weights = [k for k in engine._owned.buf if not k.endswith((".la", ".lb", ".b"))]
    assert weights == []  # only adapter stacks (and fused biases): no base weight copy


def test_live_length_rounds_the_written_slot_up_to_the_chunk():
    engine = FastEngine(FastOptions(), FastExperiments(live_chunk=16))
    # the step writing slot s attends over ceil((s + 1) / 16) * 16 slots, at most T
    assert [engine.live_length(s, 40) for s in (0, 15, 16, 31, 32, 39)] == [16, 16, 32, 32, 40, 40]
    assert (
        FastEngine(FastOptions(), FastExperiments(live_chunk=0)).live_length(3, 40) == 40
    )  # 0: the whole capacity


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_live_length_attention_equals_whole_cache_attention(kind):
    """Prompts end at slot 6 and 40 tokens are decoded (slots 7..45 of T=128): live chunk 8
    attends over 8, 16, ..., 48 slots, chunk 0 over all 128; the masked slots weigh
    exp(-inf) = 0, so the tokens are the same and the log-probs equal to rounding."""
    model = tiny(kind)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=40)
    whole = fast_run(
        model, params, FastEngine(FastOptions(), FastExperiments(live_chunk=0)), eos=()
    )
    live = fast_run(model, params, FastEngine(FastOptions(), FastExperiments(live_chunk=8)), eos=())
    assert live.response_ids.tolist() == whole.response_ids.tolist()
    torch.testing.assert_close(live.rollout_logprobs, whole.rollout_logprobs, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("compile_step", [False, True])
def test_cuda_graphs_per_live_length_equal_eager(compile_step):
    """SDPA attention: one graph per live length, with the eager or the torch.compile'd
    decode layer (kept between calls: the second call replays them)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny("qwen2").cuda()
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=40)
    eager = fast_run(
        model,
        params,
        FastEngine(FastOptions(), FastExperiments(use_cuda_graph=False, live_chunk=0)),
        eos=(),
    )
    engine = FastEngine(FastOptions(compile_step=compile_step, attention="sdpa", keep_cache=True), FastExperiments(use_cuda_graph=True, live_chunk=16))  # fmt: skip
    graphed = fast_run(model, params, engine, eos=())
    # decode writes slots 7..45: live lengths 16, 32, 48 -> three graphs
    assert engine.stats["graphs_captured"] == 3
    assert graphed.response_ids.tolist() == eager.response_ids.tolist()
    torch.testing.assert_close(graphed.rollout_logprobs, eager.rollout_logprobs)
    again = fast_run(model, params, engine, eos=())
    assert engine.stats["graphs_captured"] == 0
    assert again.response_ids.tolist() == eager.response_ids.tolist()


@pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("cc") is None,
    reason="torch.compile's CPU backend needs a C compiler",
)
def test_compiled_decode_layer_equals_eager():
    """rollout.compile: one compiled graph serves every layer (same weight keys and
    shapes); tokens equal the eager engine's, log-probs to float rounding."""
    import torch._dynamo.utils as dynamo_utils

    model = tiny("qwen2")
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=20)
    eager = fast_run(model, params, FastEngine(), eos=())
    dynamo_utils.counters.clear()
    compiled = fast_run(model, params, FastEngine(FastOptions(compile_step=True)), eos=())
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1  # 2 layers, 1 graph
    assert compiled.response_ids.tolist() == eager.response_ids.tolist()
    torch.testing.assert_close(compiled.rollout_logprobs, eager.rollout_logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_staged_kv_cache_gives_the_tokens_of_one_full_cache(kind):
    """Staged decode (the default without keep_cache): the cache first holds the prompt + 4
    new tokens; the rows still going then move, compacted, to a full-length cache. With an
    end token that stops some rows in the first stage (picked from a first run's answers)
    the greedy tokens and log-probs equal one full-size cache's (keep_cache=True: never
    staged), finished rows padded alike."""
    model = tiny(kind)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=14)
    probe = fast_run(model, params, FastEngine(FastOptions(keep_cache=True)), eos=())
    eos = int(probe.response_ids[0, 2])  # row 0 (and its twin) stops at its 3rd token
    full = fast_run(model, params, FastEngine(FastOptions(keep_cache=True)), eos=(eos,))
    engine = FastEngine(FastOptions(), FastExperiments(first_stage=4, seq_round=8))
    staged = fast_run(model, params, engine, eos=(eos,))
    ended = (full.response_ids == eos).any(1)
    assert ended.any() and not ended.all()  # some rows leave at the compaction, some go on
    assert staged.response_ids.tolist() == full.response_ids.tolist()
    assert staged.response_mask.tolist() == full.response_mask.tolist()
    torch.testing.assert_close(staged.rollout_logprobs, full.rollout_logprobs, atol=1e-5, rtol=0)
    assert engine._k is None and engine._slots == {}  # nothing kept after the call


def test_staged_decode_moves_only_the_rows_still_going():
    """The second stage's cache holds the unfinished rows only (2 of 8 here), in the
    smallest batch (exact rows without graphs), at the full length."""
    from danka.rollout.fast.slots import LayerCache

    model = tiny("llama")
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=14)
    probe = fast_run(model, params, FastEngine(FastOptions(keep_cache=True)), eos=())
    first_row = set(probe.response_ids[0].tolist())
    # every other row's first token that row 0 never samples: rows 2..7 stop at once
    eos = sorted({int(r[0]) for r in probe.response_ids[2:]} - first_row)
    shapes = []
    real = LayerCache.moved

    def spy(self, rows, length, shape):
        shapes.append((len(rows), length, shape))
        return real(self, rows, length, shape)

    LayerCache.moved = spy
    try:
        fast_run(
            model,
            params,
            FastEngine(FastOptions(), FastExperiments(first_stage=4, seq_round=8)),
            eos=eos,
        )
    finally:
        LayerCache.moved = real
    # prompts up to 7 tokens: stage 1 = 7 + 4 -> 16 slots (rounded to 8); 7 + 14 -> 24
    assert len(shapes) == 2  # k and v, one move each
    assert shapes[0][0] == 2 and shapes[0][2][0] == 2 and shapes[0][2][2] == 24
