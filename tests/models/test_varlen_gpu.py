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
