"""Fused LoRA in the fast engine (CPU): the A projections of q/k/v (gate/up) in one GEMM,
the B part as one block-diagonal GEMM; ``lora_compute="base"`` folds A into the base GEMM.

Reference points: peft's training forward, and the per-linear path (each adapted linear's
own ``x @ W.T + s * (x @ A.T) @ B.T`` as peft computes it, one module at a time)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from danka.errors import UserError
from danka.models.unwrap import unwrap_causal_lm
from danka.rollout.fast.engine import FastEngine
from danka.rollout.fast.model import _lin, prefill, rope_tables
from danka.rollout.fast.options import FastOptions
from danka.rollout.fast.weights import Owned, _fill, load_weights, model_spec
from tests.rollout.fast.test_fast_engine import DIMS, _lora_delta_cosines, _lora_layer

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _bf16_lora_model(b_std: float = 3e-3):
    """bf16 Llama, fp32 rank-8 adapters on every linear (peft's autocast_adapter_dtype)."""
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**{**DIMS, "initializer_range": 0.02}))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, b_std)
    model.to(torch.bfloat16)
    for name, p in model.named_parameters():
        if "lora" in name:
            p.data = p.data.float()
    return model


def _engine_logprobs(model, ids, owned: Owned) -> torch.Tensor:
    root = unwrap_causal_lm(model)
    spec = model_spec(root)
    return _engine_logprobs_from(root, spec, load_weights(root, spec, owned), ids)


def _per_linear_logprobs(model, ids, owned: Owned) -> torch.Tensor:
    """The engine forward with every adapted linear replaced by its own peft module (the
    'per-linear' path: one base GEMM and one peft low-rank pair per module, no fusion)."""
    root = unwrap_causal_lm(model)
    spec = model_spec(root)
    w = load_weights(root, spec, owned)
    for i, layer in enumerate(root.model.layers):
        a, f = layer.self_attn, layer.mlp
        for key, mods in (
            ("qkv", [a.q_proj, a.k_proj, a.v_proj]),
            ("o", [a.o_proj]),
            ("gu", [f.gate_proj, f.up_proj]),
            ("down", [f.down_proj]),
        ):
            w[f"{i}.{key}"] = _Modules(mods)
    import danka.rollout.fast.model as fm

    real = fm._lin

    def per_linear(w_, key, x):
        if isinstance(w_[key], _Modules):
            return torch.cat([m(x) for m in w_[key].mods], dim=-1)
        return real(w_, key, x)

    fm._lin = per_linear
    try:
        return _engine_logprobs_from(root, spec, w, ids)
    finally:
        fm._lin = real


class _Modules:
    """Stands in a weight slot: the peft modules that slot fuses."""

    def __init__(self, mods):
        self.mods = mods


def _engine_logprobs_from(root, spec, w, ids):
    cos, sin = rope_tables(root, spec, 16)
    k = torch.zeros(spec.layers, ids.shape[0], spec.kv_heads, 16, spec.head_dim, dtype=spec.dtype)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logits = prefill(w, spec, ids, mask, cos, sin, k, torch.zeros_like(k), slice(0, None), 1)
    return logits.log_softmax(-1)


def test_fused_adapter_path_equals_per_linear_path_bit_for_bit():
    """lora_compute="adapter" (default): fusing q/k/v and gate/up (stacked A, block-diagonal
    s*B, in-place add) changes no bit against the per-linear peft modules."""
    model = _bf16_lora_model(b_std=0.05)
    ids = torch.randint(1, 300, (8, 12), generator=torch.Generator().manual_seed(1))
    fused = _engine_logprobs(model, ids, Owned())
    per_linear = _per_linear_logprobs(model, ids, Owned())
    # base GEMMs of the fused rows equal the per-module ones on CPU; the low-rank sums are
    # the same fp32 dot products; one rounding each: identical
    torch.testing.assert_close(fused, per_linear, atol=1e-6, rtol=0)


def test_base_compute_logprobs_match_adapter_path_and_training_forward():
    """lora_compute="base" (A folded into the base GEMM, bf16 low-rank path): next-token
    log-probs within bf16 noise of the exact fp32-adapter path and of peft's forward."""
    model = _bf16_lora_model(b_std=0.05)
    ids = torch.randint(1, 300, (8, 12), generator=torch.Generator().manual_seed(1))
    exact = _engine_logprobs(model, ids, Owned())
    folded_owned = Owned(lora_compute="base")
    folded = _engine_logprobs(model, ids, folded_owned)
    with torch.no_grad():
        train = model(input_ids=ids).logits[:, -1].float().log_softmax(-1)
    assert "0.qkv.la" not in folded_owned.buf  # A lives in the fused base buffer
    assert folded_owned.buf["0.qkv"].shape[0] == 64 + 2 * 32 + 3 * 8  # q|k|v rows + 3 x r
    assert folded_owned.buf["0.o"].shape[0] == 64 + 8
    assert not torch.equal(folded, exact)  # a different (bf16) low-rank path
    with torch.no_grad():  # the fp32 truth: the same model and adapter in fp32
        truth = copy.deepcopy(model).float()(input_ids=ids).logits[:, -1].log_softmax(-1)
    err_base, err_exact = ((x - truth).abs().mean().item() for x in (folded, exact))
    # measured on CPU: 0.0008 vs 0.0007 (bf16 noise of the base model dominates both)
    assert err_base < 1.5 * err_exact, (err_base, err_exact)
    assert (folded - exact).abs().max().item() < 0.02
    assert (exact - train).abs().max().item() < 1e-5  # the default path is peft's exactly


@pytest.mark.parametrize("mode", ["adapter", "base"])
def test_lora_delta_cosine_per_mode(mode, monkeypatch):
    """H3's tolerance test (the change an adapter makes, engine vs fp32) in both modes."""
    import danka.rollout.fast.weights as fw

    monkeypatch.setattr(fw, "Owned", lambda: Owned(lora_compute=mode))
    engine, train = _lora_delta_cosines("cpu")
    assert engine > 0.95 and train > 0.95 and abs(engine - train) < 0.02


def test_base_compute_keeps_a_sub_bf16_step_delta():
    """Folded bf16 low-rank path: a delta below W's bf16 half-step is still in the output
    (added before the single rounding), as in peft's forward."""
    d, hidden = 0.0025, 1024
    layer = _lora_layer(hidden, d=d)
    spec = SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cpu"))
    w: dict = {}
    _fill(Owned(lora_compute="base"), "proj", [layer], spec, False, w)
    assert w["proj.la"] is None and w["proj"].shape == (64 + 1, hidden)  # [W; A]
    x = torch.ones(3, hidden, dtype=torch.bfloat16)
    with torch.no_grad():
        engine, train = _lin(w, "proj", x), layer(x)
        base = torch.nn.functional.linear(x, layer.base_layer.weight)
    shift = (engine.float() - base.float()).mean().item()
    # H * d = 1024 * 0.0025 = 2.56 (d = 0.0025 is exact enough in bf16: 0.00250244...,
    # H * d_bf16 = 2.5625); outputs ~ 48 have a bf16 step of 0.25, so within 0.2
    assert abs(shift - hidden * d) < 0.2
    assert (engine.float() - train.float()).abs().max().item() <= 0.25  # <= one bf16 step


@pytest.mark.parametrize("mode", ["adapter", "base"])
def test_adapter_buffers_refresh_only_when_the_adapter_changed(mode):
    """A FROZEN adapter (e.g. a loaded one at evaluation) is copied once; a TRAINED one is
    re-copied at every call, since a fused optimizer step does not bump ``_version``."""
    model = _bf16_lora_model()
    root = unwrap_causal_lm(model)
    spec = model_spec(root)
    owned = Owned(lora_compute=mode)
    b = root.model.layers[0].self_attn.k_proj.lora_B["default"].weight
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in lora:
        p.requires_grad_(False)
    w = load_weights(root, spec, owned)
    lb = w["0.qkv.lb"]
    v0 = lb._version
    load_weights(root, spec, owned)
    assert lb._version == v0  # unchanged frozen adapter: no copy
    for p in lora:
        p.requires_grad_(True)
    with torch.no_grad():
        b.add_(1.0)  # an optimizer step (in place: same data_ptr)
    w2 = load_weights(root, spec, owned)
    assert w2["0.qkv.lb"] is lb and lb._version > v0  # same buffer (graphs), new values
    # rows 64..96 are k's; its block is columns 8..16 (q's adapter is the first r = 8)
    torch.testing.assert_close(lb[64:96, 8:16].float(), (b * 2.0).float(), atol=2e-2, rtol=1e-2)


def test_lora_compute_option_is_checked():
    with pytest.raises(UserError, match="lora_compute"):
        FastEngine(FastOptions(lora_compute="fp8"))
    assert FastEngine(FastOptions(lora_compute="base"))._owned.lora_compute == "base"


def test_release_and_keep_cache_false_hold_no_cache_tensors():
    """After release() (or any call without keep_cache=True: the default frees) the engine
    references no KV cache, rope table, fused/adapter buffer or decode slot: they are
    freed."""
    import gc
    import weakref

    from danka.rollout.base import SamplingParams
    from danka.rollout.fast.options import keeps_cache
    from tests.rollout.fast.test_fast_engine import PROMPTS, tiny

    assert not keeps_cache(None) and not keeps_cache(False) and keeps_cache(True)
    model = get_peft_model(tiny("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=4)
    for engine, explicit in (
        (FastEngine(FastOptions(keep_cache=True)), True),
        (FastEngine(), False),
    ):
        refs: list = []
        real_release = engine.release

        def spy(engine=engine, refs=refs, real_release=real_release):
            held = [engine._k, engine._v, engine._cos, *engine._owned.buf.values()]
            held += [t for st in engine._slots.values() for t in (st.tok, st.out_tok, st.out_lp)]
            refs.extend(weakref.ref(t) for t in held if t is not None)
            real_release()

        engine.release = spy
        engine.generate(model, PROMPTS, params, eos_ids=[299], pad_id=0)
        if explicit:  # keep_cache=True: kept until release()
            assert engine._k is not None and engine._owned.buf and engine._slots
            engine.release()
        gc.collect()
        # k, v, rope table, the 2 layers' q|k|v B stacks (A is folded into rows reserved
        # after the co-located weights), 3 decode slots; the fused base matrices are views
        # of the model's own weights (nothing to free)
        assert len(refs) >= 8
        assert engine._k is None and engine._v is None and engine._cos is None
        assert not engine._owned.buf and not engine._slots and engine._pool is None
        assert all(r() is None for r in refs)  # nothing else keeps them alive


def test_base_compute_engine_matches_a_bf16_adapter_training_forward():
    """lora_compute="base" is the engine's side of danka.models.lora.compute_adapters_in:
    next-token log-probs within bf16 noise of that training forward."""
    from danka.models.lora import compute_adapters_in

    model = _bf16_lora_model(b_std=0.05)
    compute_adapters_in(model, torch.bfloat16)
    ids = torch.randint(1, 300, (8, 12), generator=torch.Generator().manual_seed(1))
    engine = _engine_logprobs(model, ids, Owned(lora_compute="base"))
    with torch.no_grad():
        train = model(input_ids=ids).logits[:, -1].float().log_softmax(-1)
    assert (engine - train).abs().mean().item() < 2e-3
    assert (engine - train).abs().max().item() < 0.02


def test_engine_sees_a_fused_adamw_step():
    """Regression (H200, 2026-11-30): danka's CUDA optimizer is AdamW(fused=True), which
    updates parameters in place without bumping ``_version``; the engine's buffers were
    keyed on (data_ptr, _version), so every rollout and evaluation after step 0 sampled from
    the untrained adapter. After one fused step the fast engine must agree with HF generate
    on the UPDATED model."""
    from danka.models.lora import apply_lora
    from danka.rollout.base import SamplingParams, build_engine
    from tests.rollout.fast.test_fast_engine import PROMPTS, tiny

    torch.manual_seed(0)
    model = apply_lora(tiny("llama"), r=4, alpha=8, dropout=0.0, target_modules="all-linear")
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    fast, hf = build_engine("fast"), build_engine("hf")

    def greedy(engine):
        return engine.generate(model, PROMPTS, params, eos_ids=[1], pad_id=0).response_ids

    before = greedy(fast)
    assert torch.equal(before, greedy(hf))
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=0.5, fused=True)
    versions = [p._version for p in trained]
    model(input_ids=torch.tensor([PROMPTS[0]])).logits.float().pow(2).mean().backward()
    opt.step()
    assert [p._version for p in trained] == versions  # the trap: no version bump
    after_hf = greedy(hf)
    assert not torch.equal(after_hf, before)  # the step changed the greedy answers
    assert torch.equal(greedy(fast), after_hf)  # and the engine sees it


def test_merge_compute_weights_are_w_plus_scaled_ba_with_no_low_rank_path():
    """lora_compute="merge": each adapted projection is one engine-owned buffer holding the
    stacked W + s * B @ A (fp32 sum, one rounding to bf16), and no adapter pair is left."""
    model = _bf16_lora_model(b_std=0.05)
    root = unwrap_causal_lm(model)
    owned = Owned(lora_compute="merge")
    w = load_weights(root, model_spec(root), owned)
    attn = root.model.layers[0].self_attn
    assert w["0.qkv.la"] is None and w["0.qkv.lb"] is None and w["0.o.la"] is None
    assert w["0.qkv"].shape == (64 + 2 * 32, 64) and w["0.qkv"].dtype == torch.bfloat16
    k = attn.k_proj
    # scaling = lora_alpha / r = 16 / 8 = 2
    want = (
        k.base_layer.weight.float() + 2.0 * k.lora_B["default"].weight @ k.lora_A["default"].weight
    )
    torch.testing.assert_close(
        w["0.qkv"][64:96].float(), want.to(torch.bfloat16).float(), atol=0, rtol=0
    )
    assert w["0.o"].data_ptr() != attn.o_proj.base_layer.weight.data_ptr()  # a copy, not live


def test_merge_compute_logprobs_match_the_exact_path_within_bf16_noise():
    """Merged bf16 weights vs the exact fp32-adapter path: next-token log-probs within
    bf16 noise of the fp32 truth (the merge rounds W + delta once, as a bf16 model)."""
    model = _bf16_lora_model(b_std=0.05)
    ids = torch.randint(1, 300, (8, 12), generator=torch.Generator().manual_seed(1))
    exact = _engine_logprobs(model, ids, Owned())
    merged = _engine_logprobs(model, ids, Owned(lora_compute="merge"))
    with torch.no_grad():
        truth = copy.deepcopy(model).float()(input_ids=ids).logits[:, -1].log_softmax(-1)
    err_merge, err_exact = ((x - truth).abs().mean().item() for x in (merged, exact))
    assert not torch.equal(merged, exact)
    assert err_merge < 2.0 * err_exact, (err_merge, err_exact)
    assert (merged - exact).abs().max().item() < 0.03


def test_merge_compute_sees_every_optimizer_step():
    """A trained adapter is merged again at every call (an in-place step keeps the buffer
    address the CUDA graphs hold, with the new values)."""
    model = _bf16_lora_model()
    root = unwrap_causal_lm(model)
    spec = model_spec(root)
    owned = Owned(lora_compute="merge")
    buf = load_weights(root, spec, owned)["0.o"]
    before = buf.float().clone()
    o = root.model.layers[0].self_attn.o_proj
    with torch.no_grad():
        o.lora_B["default"].weight.add_(0.5)  # in place, as a fused AdamW step
    assert load_weights(root, spec, owned)["0.o"] is buf
    # + s * (0.5 * ones) @ A = 2 * 0.5 * column sums of A, broadcast over the rows
    shift = (o.lora_A["default"].weight.sum(0)).float()
    torch.testing.assert_close(
        buf.float() - before, shift.expand_as(buf).float(), atol=0.02, rtol=0.02
    )


def test_merge_is_refused_for_a_model_too_large_for_copies(monkeypatch):
    import danka.rollout.fast.options as fast_options
    from danka.rollout.base import SamplingParams
    from tests.rollout.fast.test_fast_engine import PROMPTS, tiny

    monkeypatch.setattr(fast_options, "FUSE_LIMIT_BYTES", 0)  # every model is "too large" now
    model = get_peft_model(tiny("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(UserError, match="lora_compute: merge keeps merged copies"):
        FastEngine(FastOptions(lora_compute="merge")).generate(
            model, PROMPTS, SamplingParams(n=1, max_new_tokens=2), eos_ids=[299], pad_id=0
        )
