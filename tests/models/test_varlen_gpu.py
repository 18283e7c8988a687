"""On a CUDA GPU: the padding-free forward through torch's varlen kernel gives the padded
forward's log-probs and values (bf16 noise), and its gradients point the same way."""

from __future__ import annotations

import pytest
import torch

from danka.models import varlen
from danka.models.tiny import tiny_causal_lm
from danka.models.value_head import ValueHead
from danka.rollout.base import finish_batch
from danka.step.forward import ForwardSettings, critic_values, policy_logprobs, trim

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _batch(n: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 200, (int(k),), generator=g).tolist()
               for k in torch.randint(5, 40, (n // 2,), generator=g)]  # fmt: skip
    responses = [torch.randint(3, 200, (int(k),), generator=g).tolist()
                 for k in torch.randint(1, 60, (n,), generator=g)]  # fmt: skip
    return trim(finish_batch(prompts, responses, 2, eos_ids=[2], pad_id=0, max_new_tokens=64))


def test_varlen_kernel_matches_padded_forward():
    assert varlen.available(torch.device("cuda"))
    torch.manual_seed(0)
    model = tiny_causal_lm(arch="qwen2").to("cuda", torch.bfloat16)
    head = ValueHead(model.config.hidden_size).to("cuda")
    mb = _batch()
    mask = mb.response_mask.bool().cuda()
    out = {}
    for on in (False, True):
        model.zero_grad()
        fwd = ForwardSettings(chunk_size=128, varlen=on)
        lp, _ = policy_logprobs(model, mb, settings=fwd)
        v = critic_values(model, mb, value_head=head, settings=fwd)
        (lp[mask].sum() + v[mask].sum()).backward()
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.float().flatten()
        out[on] = (lp[mask].float(), v[mask].float(), grad)
    assert (out[True][0] - out[False][0]).abs().mean() < 0.02
    assert (out[True][1] - out[False][1]).abs().mean() < 0.02
    cos = torch.nn.functional.cosine_similarity(out[True][2], out[False][2], dim=0)
    assert cos > 0.99


def _lora_model():
    from danka.models.lora import apply_lora

    torch.manual_seed(0)
    model = tiny_causal_lm(arch="qwen2").to("cuda", torch.bfloat16)
    model = apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules="all-linear")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model


def _logprobs_and_grads(model, mb):
    model.zero_grad()
    mask = mb.response_mask.bool().cuda()
    lp, _ = policy_logprobs(model, mb, settings=ForwardSettings(chunk_size=128, varlen=True))
    lp[mask].sum().backward()
    grads = [p.grad.float().flatten() for n, p in model.named_parameters() if "lora_" in n]
    return lp[mask].float().detach(), torch.cat(grads)


def test_fused_lora_layers_and_compiled_layers_match_peft_on_cuda():
    """danka.models.lora_linear (the CUDA default with the padding-free update) and
    speed.compile_layers give peft's eager log-probs and gradients within bf16 noise."""
    import copy

    from danka.models import lora_linear
    from danka.models.lora import compute_adapters_in
    from danka.models.speed import compile_layers

    mb = _batch()
    model = _lora_model()
    compute_adapters_in(model, torch.bfloat16)
    peft = copy.deepcopy(model)
    for m in peft.modules():
        lora_linear.uninstall(m)
    lp_peft, g_peft = _logprobs_and_grads(peft, mb)
    lp_fused, g_fused = _logprobs_and_grads(model, mb)
    assert (lp_fused - lp_peft).abs().mean() < 0.02
    assert torch.nn.functional.cosine_similarity(g_fused, g_peft, dim=0) > 0.995
    assert compile_layers(model) == model.config.num_hidden_layers
    for seed in (1, 2):  # two token counts: one dynamic graph, not a recompile per shape
        mb = _batch(seed=seed)
        lp_eager, g_eager = _logprobs_and_grads(peft, mb)
        lp_comp, g_comp = _logprobs_and_grads(model, mb)
        assert (lp_comp - lp_eager).abs().mean() < 0.02
        assert torch.nn.functional.cosine_similarity(g_comp, g_eager, dim=0) > 0.995
    from danka.models import speed

    assert not speed._compile_failed
