"""Chunked log-probs/entropy equal the naive full-logits computation (values and gradients)."""

import pytest
import torch
import torch.nn.functional as F

from danka.models.logprobs import chunked_logprobs_entropy


def _naive(hidden, weight, targets, temperature):
    logp_all = F.log_softmax((hidden @ weight.T).float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def test_hand_computed_two_token_vocab():
    # h = [1, 0], W = [[ln 3, 0], [0, 0]] -> logits [ln 3, 0] -> p = [3/4, 1/4]
    # logp(target 0) = ln 3/4; H = -(3/4 ln 3/4 + 1/4 ln 1/4)
    hidden = torch.tensor([[1.0, 0.0]])
    weight = torch.tensor([[torch.log(torch.tensor(3.0)).item(), 0.0], [0.0, 0.0]])
    logp, ent = chunked_logprobs_entropy(hidden, weight, torch.tensor([0]))
    expected_h = -(0.75 * torch.log(torch.tensor(0.75)) + 0.25 * torch.log(torch.tensor(0.25)))
    assert logp.item() == pytest.approx(torch.log(torch.tensor(0.75)).item(), abs=1e-6)
    assert ent.item() == pytest.approx(expected_h.item(), abs=1e-6)


@pytest.mark.parametrize("temperature,chunk", [(1.0, 4), (0.7, 3), (1.3, 1000)])
def test_chunked_matches_naive_values_and_grads(temperature, chunk):
    torch.manual_seed(0)
    n, h, v = 11, 8, 37
    hidden = torch.randn(n, h, dtype=torch.float64).float().requires_grad_(True)
    weight = torch.randn(v, h).requires_grad_(True)
    targets = torch.randint(0, v, (n,))
    g_lp, g_ent = torch.randn(n), torch.randn(n)

    lp, ent = chunked_logprobs_entropy(
        hidden, weight, targets, temperature=temperature, chunk_size=chunk
    )
    (lp * g_lp + ent * g_ent).sum().backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    lp_ref, ent_ref = _naive(hidden, weight, targets, temperature)
    (lp_ref * g_lp + ent_ref * g_ent).sum().backward()
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(gh, hidden.grad, atol=1e-5, rtol=0)
    torch.testing.assert_close(gw, weight.grad, atol=1e-5, rtol=0)


def test_no_entropy_returns_none_and_grads_match():
    torch.manual_seed(1)
    hidden = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(9, 4)
    targets = torch.randint(0, 9, (5,))
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=2, compute_entropy=False)
    assert ent is None
    lp.sum().backward()
    g = hidden.grad.clone()
    hidden.grad = None
    _naive(hidden, weight, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(g, hidden.grad, atol=1e-5, rtol=0)


def _head_case(device, dtype, n=24, h=64, v=1000):
    torch.manual_seed(0)
    hidden = (torch.randn(n, h, device=device) * 0.5).to(dtype).requires_grad_(True)
    weight = (torch.randn(v, h, device=device) * 0.5).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (n,), device=device)
    return hidden, weight, targets


def _check_low_precision_head(device):
    """A bf16 head: values and both gradients match the float64 reference of the same bf16
    numbers to bf16 accuracy (logits, softmax and entropy are float32 inside)."""
    hidden, weight, targets = _head_case(device, torch.bfloat16)
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=7, temperature=0.8)
    (lp.sum() + 0.5 * ent.sum()).backward()
    h64 = hidden.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    rlp, rent = _naive(h64, w64, targets, 0.8)
    (rlp.sum() + 0.5 * rent.sum()).backward()
    assert lp.dtype == torch.float32 and hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp.double(), rlp.double(), atol=0.05, rtol=0.01)
    torch.testing.assert_close(ent.double(), rent.double(), atol=0.05, rtol=0.01)
    torch.testing.assert_close(hidden.grad.double(), h64.grad, atol=0.02, rtol=0.02)
    torch.testing.assert_close(weight.grad.double(), w64.grad, atol=0.02, rtol=0.02)


def test_bf16_head_values_and_grads_cpu():
    _check_low_precision_head("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_head_values_grads_and_no_fp32_copy_cuda():
    _check_low_precision_head("cuda")
    # Qwen2.5 head: 151,936 x 896 bf16 (272 MB); an fp32 copy would add 545 MB.
    hidden, weight, targets = _head_case("cuda", torch.bfloat16, n=2048, h=896, v=151936)
    weight.requires_grad_(False)  # LoRA: a frozen head, only the hidden states need grads
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=64)
    (lp.sum() + ent.sum()).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # per chunk of 64 rows: float32 logits, p, dz and a few temporaries, ~39 MB each; the
    # old float32 copy of the head alone was 151936 x 896 x 4 = 545 MB
    assert extra < 0.75 * 151936 * 896 * 4, f"{extra / 2**20:.0f} MiB extra"
    assert torch.isfinite(hidden.grad).all()


@pytest.mark.skipif(
    __import__("shutil").which("gcc") is None and __import__("shutil").which("cc") is None,
    reason="torch.compile's CPU backend needs a C compiler",
)
def test_head_functions_compile_whole_and_equal_eager():
    """What CUDA runs compiled: both per-chunk functions trace as ONE graph each
    (fullgraph: no break), rows dynamic (a 7-row and a 5-row chunk share the graph), and
    equal their eager values. dz at the target: g_lp * (1 - p_y) / T, elsewhere -g_lp * p / T
    (plus the entropy term): checked against the eager function, which the naive-reference
    tests above pin down."""
    import torch._dynamo.utils as dynamo_utils

    from danka.models.logprobs import _head_dz, _head_stats

    torch.manual_seed(3)
    dynamo_utils.counters.clear()
    torch._dynamo.reset()
    stats = torch.compile(_head_stats, dynamic=None, fullgraph=True)
    dz = torch.compile(_head_dz, dynamic=None, fullgraph=True)
    for rows in (7, 5):
        z, y = torch.randn(rows, 37) * 3, torch.randint(0, 37, (rows,))
        g_lp, g_ent = torch.randn(rows), torch.randn(rows)
        for t in (z, y, g_lp, g_ent):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        for got, ref in (
            (stats(z, y, 1 / 0.7, True), _head_stats(z, y, 1 / 0.7, True)),
            (dz(z, y, g_lp, g_ent, 1 / 0.7, torch.float32), _head_dz(z, y, g_lp, g_ent, 1 / 0.7, torch.float32)),
            (dz(z, y, g_lp, None, 1.0, torch.float32), _head_dz(z, y, g_lp, None, 1.0, torch.float32)),
        ):  # fmt: skip
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # stats, dz with entropy, dz without: 3 graphs for 2 chunk lengths (no recompiles)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_head_on_cuda_equals_eager_and_uses_less_memory():
    """The compiled per-chunk head (the CUDA default) against the same code run eagerly:
    values, gradients, and the peak of a Qwen2.5-sized head (V = 151,936) over chunks of
    different lengths (2048 rows in chunks of 512 + a 200-row tail... one compile)."""
    import danka.models.logprobs as lpm

    def run(fused: bool):
        hidden, weight, targets = _head_case("cuda", torch.bfloat16, n=1736, h=896, v=151936)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=512, fused=fused)
        (lp.sum() + 0.1 * ent.sum()).backward()
        torch.cuda.synchronize()
        return lp, ent, hidden.grad, weight.grad, torch.cuda.max_memory_allocated() - base

    eager = run(False)
    run(True)  # compiles
    fused = run(True)
    assert lpm._compiled.get("dz") is not None and lpm._compiled.get("stats") is not None
    for f, e in zip(fused[:2], eager[:2]):
        torch.testing.assert_close(f, e, atol=2e-4, rtol=1e-4)
    for f, e in zip(fused[2:4], eager[2:4]):  # bf16 grads: dz rounded to bf16 by each path
        # (a few of 1.5M elements differ by ~2e-3 on an H200): the whole tensor agrees
        rel = (f.float() - e.float()).norm() / e.float().norm()
        assert rel < 1e-3, rel
    assert fused[4] < 0.7 * eager[4], (fused[4] / 2**20, eager[4] / 2**20)
