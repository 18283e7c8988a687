"""danka/models/fused_norm.py: transformers' RMSNorm through F.rms_norm, the same numbers."""

import copy

import pytest
import torch
from torch import nn

from danka.models import fused_norm
from danka.models.tiny import tiny_causal_lm


def test_one_norm_by_hand():
    # x = (3, 4): mean(x^2) = 12.5, rsqrt(12.5 + 0.5) = 1 / sqrt(13); weight (2, -1)
    model = tiny_causal_lm(arch="qwen2", layers=1)
    norm = model.model.norm
    norm.weight = nn.Parameter(torch.tensor([2.0, -1.0]))
    norm.variance_epsilon = 0.5
    assert fused_norm.install(norm) == 1
    assert type(norm).__name__ == "FusedQwen2RMSNorm" and isinstance(norm, fused_norm._Fused)
    got = norm(torch.tensor([[3.0, 4.0]]))[0]
    s = 13**0.5
    assert got.tolist() == pytest.approx([6 / s, -4 / s], abs=1e-6)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_model_computes_the_same_forward_and_gradients(arch):
    model = tiny_causal_lm(arch=arch, layers=2)
    fused = copy.deepcopy(model)
    assert fused_norm.install(fused) == 2 * 2 + 1  # two a layer and the final one
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    ref = model(input_ids=ids).logits
    got = fused(input_ids=ids).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    ref.square().mean().backward()
    got.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bf16_within_one_rounding_and_uninstall_restores_the_class():
    model = tiny_causal_lm(arch="qwen2", layers=1).to(torch.bfloat16)
    norm = model.model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16) * 3
    ref = norm(x)
    fused_norm.install(model)
    got = norm(x)
    assert got.dtype == torch.bfloat16
    # one rounding instead of two: within 2 bf16 ulps (2^-7 relative) of transformers'
    assert ((got.float() - ref.float()).abs() <= 2 * 2**-7 * ref.float().abs() + 1e-3).all()
    assert not torch.equal(got, x)
    fused_norm.uninstall(model)
    assert type(norm).__name__ == "Qwen2RMSNorm"
    assert torch.equal(norm(x), ref)


def test_other_norms_are_left_alone():
    class GemmaRMSNorm(nn.Module):  # computes x * (1 + w): not the plain formula
        variance_epsilon = 1e-6

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(4))

    holder = nn.Sequential(GemmaRMSNorm(), nn.LayerNorm(4))
    assert fused_norm.install(holder) == 0
    assert type(holder[0]) is GemmaRMSNorm and type(holder[1]) is nn.LayerNorm
