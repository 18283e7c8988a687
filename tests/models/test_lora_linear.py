"""danka.models.lora_linear: one LoRA layer as one autograd function, against peft's
forward (hand-computed for one layer; a whole model's gradients in fp32 and bf16; CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from danka.models import lora_linear
from danka.models.lora import compute_adapters_in, reference_mode
from tests.models.test_lora_compute_dtype import IDS, _bf16_base, _fp32_lora_model, _rel


def test_one_layer_forward_and_gradients_by_hand():
    # x (1, 2), W (1, 2), b, A (1, 2), B (1, 1), s = 2:
    # y = x.W + b + s (x.A) B = (1*3 + 2*4) + 0.5 + 2 * (1*1 + 2*-1) * 5 = 11.5 - 10 = 1.5
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    w, bias = torch.tensor([[3.0, 4.0]]), torch.tensor([0.5])
    a = torch.tensor([[1.0, -1.0]], requires_grad=True)
    b = torch.tensor([[5.0]], requires_grad=True)
    y = lora_linear.lora_linear(x, w, bias, a, b, 2.0)
    assert y.tolist() == [[1.5]]
    (3 * y).sum().backward()  # g = 3
    # dx = g W + s (g B) A = 3*[3, 4] + 2*15*[1, -1] = [39, -18]
    assert x.grad.tolist() == [[39.0, -18.0]]
    # dA = s (g B)^T x = 2 * 15 * [1, 2] = [30, 60];  dB = s g (x.A) = 2 * 3 * -1 = -6
    assert a.grad.tolist() == [[30.0, 60.0]]
    assert b.grad.tolist() == [[-6.0]]


def _grads(model):
    model.zero_grad()
    out = model(input_ids=IDS, labels=IDS)
    out.loss.backward()
    named = [(n, p) for n, p in model.named_parameters() if "lora" in n]
    return {n: p.grad.float().clone() for n, p in named}, out.logits.detach().float()


def _calls(model) -> int:
    """How many LoRA layers ran through the fused function in one forward."""
    seen = []
    fn = lora_linear._LoraLinear.apply
    lora_linear._LoraLinear.apply = lambda *a: seen.append(1) or fn(*a)
    try:
        with torch.no_grad():
            model(input_ids=IDS)
    finally:
        lora_linear._LoraLinear.apply = fn
    return len(seen)


def test_fused_model_equals_peft_in_fp32():
    """fp32 base and adapters: the same math as peft's forward, so equal to fp32 rounding."""
    peft = _fp32_lora_model()
    fused = copy.deepcopy(peft)
    assert compute_adapters_in(fused, torch.float32) == 14
    assert _calls(fused) == 14 and _calls(peft) == 0
    g_peft, z_peft = _grads(peft)
    g_fused, z_fused = _grads(fused)
    assert torch.allclose(z_fused, z_peft, atol=1e-5)
    for name in g_peft:
        assert torch.allclose(g_fused[name], g_peft[name], rtol=1e-4, atol=1e-7), name


def test_fused_bf16_is_within_bf16_noise_of_fp32_truth():
    truth = _fp32_lora_model()
    g_truth, _ = _grads(truth)
    model = _bf16_base(truth)
    compute_adapters_in(model, torch.bfloat16)
    assert _calls(model) == 14
    g, _ = _grads(model)
    assert {p.grad.dtype for n, p in model.named_parameters() if "lora" in n} == {torch.float32}
    flat = lambda gs: torch.cat([v.flatten() for v in gs.values()])  # noqa: E731
    assert _rel(flat(g), flat(g_truth)) < 4 * 2**-8


def test_a_deep_copy_computes_like_its_original():
    """The bf16 casts and the fused layers survive ``copy.deepcopy`` (a per-module bound
    ``forward`` did not: the copy's adapters computed in fp32 against bf16 inputs)."""
    model = _bf16_base(_fp32_lora_model())
    compute_adapters_in(model, torch.bfloat16)
    twin = copy.deepcopy(model)
    for m in twin.modules():
        lora_linear.uninstall(m)  # the copy through peft's forward, adapters still in bf16
    assert _calls(model) == 14 and _calls(twin) == 0
    flat = lambda gs: torch.cat([v.flatten() for v in gs.values()])  # noqa: E731
    assert _rel(flat(_grads(twin)[0]), flat(_grads(model)[0])) < 4 * 2**-8


def test_reference_mode_dropout_and_restore_take_peft_path():
    model = _fp32_lora_model()
    compute_adapters_in(model, torch.float32)
    with reference_mode(model):
        assert _calls(model) == 0  # adapters off: the base alone
        with torch.no_grad():
            ref = model(input_ids=IDS).logits
    base = copy.deepcopy(model.get_base_model())
    with torch.no_grad():
        assert not torch.equal(model(input_ids=IDS).logits, ref)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    layer.lora_dropout["default"] = nn.Dropout(0.5)
    model.train()
    assert _calls(model) == 13  # dropout in training: that layer through peft
    model.eval()
    assert _calls(model) == 14
    compute_adapters_in(model, None)
    assert _calls(model) == 0 and not isinstance(layer, lora_linear._Fused)
    del base


@pytest.mark.parametrize("frozen", [True, False])
def test_only_a_frozen_plain_linear_base_fuses(frozen):
    model = _fp32_lora_model()
    layer = model.base_model.model.model.layers[0].mlp.up_proj
    layer.base_layer.weight.requires_grad_(not frozen)
    assert lora_linear.fusable(layer) is frozen


def test_compiled_layers_compile_once_for_all_layers(monkeypatch):
    """speed.compile compiles one decoder layer's code for every layer: the fused LoRA
    layers and the bf16 adapter casts are classes, so no guard differs between layers (each
    layer's own bound ``forward`` recompiled per layer: the H100's recompile limit hit, most
    layers eager). A no-grad pass adds one graph, not one per layer; numbers unchanged."""
    from danka.models import speed

    graphs = []
    compile_ = torch.compile

    def backend(gm, example_inputs):  # dynamo's guards and graph breaks, without inductor
        graphs.append(gm)
        return gm

    def counting(fn, dynamic):  # one backend for all layers, as inductor's compare equal
        return compile_(fn, dynamic=dynamic, backend=backend)

    monkeypatch.setattr(torch, "compile", counting)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 64)
    torch._dynamo.reset()
    model = _bf16_base(_fp32_lora_model(num_hidden_layers=4))
    compute_adapters_in(model, torch.bfloat16)
    eager = copy.deepcopy(model)
    layers = speed.compile_layers(model)
    assert layers == 4
    for m in (eager, model):
        m.zero_grad()
        out = m(input_ids=IDS, labels=IDS, use_cache=False)
        out.loss.backward()
    per_pass = len(graphs)
    assert 1 <= per_pass < layers
    with torch.no_grad():
        model(input_ids=IDS, use_cache=False)
    assert len(graphs) <= 2 * per_pass
    for (n, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        if "lora" in n:
            assert torch.equal(p.grad, q.grad), n
    assert not speed._compile_failed
