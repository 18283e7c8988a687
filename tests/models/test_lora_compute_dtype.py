"""LoRA adapters computed in bf16 with fp32 master weights (danka.models.lora
.compute_adapters_in), against fp32 truth and peft's default fp32 adapter compute (CPU)."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from danka.models.lora import apply_lora, compute_adapters_in
from tests.rollout.fast.test_fast_engine import DIMS as FAST_DIMS

DIMS = {**FAST_DIMS, "initializer_range": 0.02}  # HF's default init
IDS = torch.randint(1, 300, (4, 24), generator=torch.Generator().manual_seed(1))


def _fp32_lora_model(**dims):
    torch.manual_seed(0)
    model = apply_lora(
        LlamaForCausalLM(LlamaConfig(**{**DIMS, **dims})),
        r=8,
        alpha=16,
        dropout=0.0,
        target_modules="all-linear",
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)  # B = 0 at init would leave A without a gradient
    return model


def _bf16_base(model):
    """bf16 base, fp32 adapters: what peft's autocast_adapter_dtype gives on a bf16 base."""
    model = copy.deepcopy(model).to(torch.bfloat16)
    for name, p in model.named_parameters():
        if "lora" in name:
            p.data = p.data.float()
    return model


def _lora_grads(model) -> tuple[torch.Tensor, float]:
    model.zero_grad()
    out = model(input_ids=IDS, labels=IDS)
    out.loss.backward()
    grads = [p.grad.float().flatten() for n, p in model.named_parameters() if "lora" in n]
    return torch.cat(grads), out.loss.item()


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def test_bf16_adapter_compute_gradients_match_fp32_within_bf16_tolerance():
    model = _fp32_lora_model()
    g_truth, loss_truth = _lora_grads(model)  # all fp32
    default = _bf16_base(model)  # peft's default: fp32 adapter matmuls on the bf16 base
    g_default, _ = _lora_grads(default)
    fast = _bf16_base(model)
    assert compute_adapters_in(fast, torch.bfloat16) == 14  # 7 linears x 2 layers
    g_fast, loss_fast = _lora_grads(fast)
    lora = [p for n, p in fast.named_parameters() if "lora" in n]
    assert {p.dtype for p in lora} == {p.grad.dtype for p in lora} == {torch.float32}  # masters
    err_default, err_fast = _rel(g_default, g_truth), _rel(g_fast, g_truth)
    # measured on CPU: 0.0079 (fp32 adapters) vs 0.0082 (bf16 compute); the bf16 base's own
    # noise dominates; bf16 tolerance: a few units of 2^-8 = 0.0039
    assert err_fast < 4 * 2**-8 and err_fast < 1.5 * err_default, (err_fast, err_default)
    assert abs(loss_fast - loss_truth) < 1e-2
    assert _rel(g_fast, g_default) > 0  # it did change the computation


def test_bf16_adapter_compute_is_bf16_inside_and_reversible():
    model = _bf16_base(_fp32_lora_model()).train()
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    # dropout in training keeps this layer on peft's path (not danka.models.lora_linear's)
    layer.lora_dropout["default"] = torch.nn.Dropout(0.1)
    seen = []
    hook = layer.lora_B["default"].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    compute_adapters_in(model, torch.bfloat16)
    model(input_ids=IDS)
    compute_adapters_in(model, None)  # back to peft's fp32 adapter matmuls
    model(input_ids=IDS)
    hook.remove()
    assert seen == [torch.bfloat16, torch.float32]
    assert layer.cast_input_dtype_enabled is True


def test_an_optimizer_step_updates_the_fp32_masters_by_sub_bf16_amounts():
    """The reason for fp32 masters: an update far below the bf16 step of a weight is kept."""
    model = _bf16_base(_fp32_lora_model())
    compute_adapters_in(model, torch.bfloat16)
    b = model.base_model.model.model.layers[0].mlp.down_proj.lora_B["default"].weight
    before = b.detach().clone()
    _lora_grads(model)
    opt = torch.optim.SGD([b], lr=1e-6 / float(b.grad.abs().max()))  # max |step| = 1e-6
    opt.step()
    delta = b.detach() - before
    assert 0 < delta.abs().max() <= 1.01e-6 and (delta != 0).float().mean() > 0.9
    # bf16 weights (|b| ~ 0.02: bf16 step ~ 1.2e-4) would lose almost every such update
    lost = (before.bfloat16() + delta.bfloat16()) == before.bfloat16()
    assert lost[delta != 0].float().mean() > 0.9
