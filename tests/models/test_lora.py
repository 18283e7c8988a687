"""LoRA: apply, bad targets, second adapter, reference mode = base model outputs."""

import pytest
import torch

from danka.errors import UserError
from danka.models.lora import (
    adapter_parameters,
    add_adapter,
    apply_lora,
    linear_module_names,
    reference_mode,
    set_active,
    trainable_parameters,
)
from danka.models.tiny import tiny_causal_lm, tiny_tokenizer

IDS = torch.tensor([[5, 6, 7, 8, 9]])


def _model():
    return tiny_causal_lm(tiny_tokenizer(), seed=0)


def _perturb(model, name):
    with torch.no_grad():
        for p in adapter_parameters(model, name):
            p.add_(0.1 * torch.randn_like(p))


def test_apply_lora_trains_only_adapters():
    model = apply_lora(_model(), r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainable, total = trainable_parameters(model)
    # per layer: q_proj A (4x64) + B (64x4) = 512; v_proj A (4x64) + B (32x4; 2 KV heads x 16)
    # = 384 -> 896 per layer, 2 layers = 1792
    assert trainable == 1792
    assert total > trainable
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_all_linear_and_comma_string():
    model = apply_lora(_model(), r=2, alpha=4, dropout=0.0, target_modules="all-linear")
    assert adapter_parameters(model, "default")
    model2 = apply_lora(_model(), r=2, alpha=4, dropout=0.0, target_modules="q_proj, k_proj")
    assert len(adapter_parameters(model2, "default")) == 8


def test_bad_target_lists_available_names():
    with pytest.raises(UserError) as info:
        apply_lora(_model(), r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "c_attn"])
    text = str(info.value)
    assert "['c_attn']" in text and "lora.target_modules" in text
    for name in ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]:
        assert name in text
    assert linear_module_names(_model()) == [
        "down_proj", "gate_proj", "k_proj", "lm_head", "o_proj", "q_proj", "up_proj", "v_proj"
    ]  # fmt: skip


def test_reference_mode_gives_base_outputs():
    base_logits = _model()(IDS).logits
    model = apply_lora(_model(), r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "o_proj"])
    _perturb(model, "default")
    with torch.no_grad():
        adapted = model(IDS).logits
        with reference_mode(model):
            ref = model(IDS).logits
        after = model(IDS).logits
    assert not torch.allclose(adapted, base_logits, atol=1e-4)
    torch.testing.assert_close(ref, base_logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(after, adapted)  # adapters back on after the block


def test_reference_mode_needs_peft():
    with pytest.raises(ValueError, match="PeftModel"):
        with reference_mode(_model()):
            pass


def test_second_adapter_switching_keeps_both_trainable():
    model = apply_lora(_model(), r=4, alpha=8, dropout=0.0, target_modules=["q_proj"])
    add_adapter(model, "critic", r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"])
    assert linear_module_names(model) == linear_module_names(_model())  # LoRA layers still count
    assert model.active_adapter == "default"
    actor, critic = adapter_parameters(model, "default"), adapter_parameters(model, "critic")
    assert (len(actor), len(critic)) == (4, 8)
    assert all(p.requires_grad for p in actor + critic)
    _perturb(model, "default")
    _perturb(model, "critic")
    with torch.no_grad():
        out_actor = model(IDS).logits
        set_active(model, "critic")
        out_critic = model(IDS).logits
        set_active(model, "default")
        again = model(IDS).logits
    assert not torch.allclose(out_actor, out_critic, atol=1e-4)
    torch.testing.assert_close(again, out_actor)
    assert all(p.requires_grad for p in actor + critic)
    with pytest.raises(ValueError, match="already exists"):
        add_adapter(model, "critic", r=2, alpha=4, dropout=0.0, target_modules=["v_proj"])
    with pytest.raises(ValueError, match="no adapter"):
        set_active(model, "nope")
