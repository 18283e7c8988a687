"""On a CUDA GPU: micro-batches replayed from CUDA graphs (speed.cuda_graphs) give the
eager padding-free forward's log-probs and gradients (bf16 noise), LoRA (the fused layers)
and full-parameter, two micro-batches accumulating before one flush; the no-grad forward
alike; a micro-batch under half the budget runs eagerly."""

from __future__ import annotations

import pytest
import torch

from danka.models import body_graphs
from danka.models.lora import compute_adapters_in
from danka.models.tiny import tiny_causal_lm
from danka.step.forward import ForwardSettings, graph_session, policy_logprobs
from tests.models.test_varlen_gpu import _batch, _lora_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

FWD = ForwardSettings(chunk_size=128, varlen=True, seq_tokens=96, cuda_graphs=True)  # budget 8 x 96


def _losses(model, mbs, graphs: bool):
    """Log-probs of each micro-batch and the trainable gradients summed over them."""
    model.zero_grad(set_to_none=True)
    out = []
    with graph_session(FWD if graphs else None, 8, model) as s:
        for mb in mbs:
            mask = mb.response_mask.bool().cuda()
            lp, _ = policy_logprobs(model, mb, settings=FWD)
            weights = torch.linspace(-1, 1, int(mask.sum()), device="cuda")
            (lp[mask] * weights).sum().backward()
            out.append(lp[mask].float().detach())
        body_graphs.flush()
        counts = dict(s.counts) if s is not None else None
    grads = [p.grad.float().flatten() for p in model.parameters() if p.requires_grad]
    return torch.cat(out), torch.cat(grads), counts


def _check(model):
    mbs = [_batch(n=10, seed=1), _batch(n=12, seed=2)]  # two token counts, one graph
    lp_eager, g_eager, _ = _losses(model, mbs, graphs=False)
    lp_graph, g_graph, counts = _losses(model, mbs, graphs=True)
    assert counts == {"replayed": 2, "eager": 0, "captured": 1}
    assert (lp_graph - lp_eager).abs().mean() < 0.02
    assert torch.nn.functional.cosine_similarity(g_graph, g_eager, dim=0) > 0.995
    assert 0.9 < float(g_graph.norm() / g_eager.norm()) < 1.1  # summed once, not twice


def test_lora_replay_matches_the_eager_update():
    model = _lora_model()
    compute_adapters_in(model, torch.bfloat16)  # the fused layers, as on CUDA by default
    _check(model)


def test_full_parameter_replay_matches_the_eager_update():
    torch.manual_seed(0)
    _check(tiny_causal_lm(arch="qwen2").to("cuda", torch.bfloat16))


def test_no_grad_replay_and_a_small_micro_batch_eager():
    model = _lora_model().eval()
    compute_adapters_in(model, torch.bfloat16)
    mb, small = _batch(n=12, seed=3), _batch(n=2, seed=4)
    with torch.no_grad():
        eager = policy_logprobs(model, mb, settings=FWD)[0]
        with graph_session(FWD, 8, model) as s:
            replayed = policy_logprobs(model, mb, settings=FWD)[0]
            policy_logprobs(model, small, settings=FWD)
        assert s.counts == {"replayed": 1, "eager": 1, "captured": 1}
    mask = mb.response_mask.bool().cuda()
    assert (replayed[mask].float() - eager[mask].float()).abs().mean() < 0.02
