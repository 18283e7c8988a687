"""danka/rollout/fast/triton_sample.py (on a GPU, or under Triton's CPU interpreter) against
hand-computed distributions and torch's log-softmax.

Skipped where triton is not importable (CI). Run with triton on the path:
``TRITON_INTERPRET=1 python -m pytest -q THIS_FILE``.
"""

import math

import pytest
import torch

from .triton_setup import triton_device

DEVICE = triton_device()  # before danka's kernel imports triton

import danka.rollout.fast.triton_sample as ts  # noqa: E402


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _t(x: float) -> torch.Tensor:
    return torch.tensor([x], device=DEVICE)


def test_greedy_is_the_first_maximum_and_its_log_prob():
    # row 0: max at 2; row 1: a tie at 1 and 3 (the first wins, as torch.argmax);
    # row 2: all -1e4 except 0 at the last of 5 entries
    logits = torch.tensor(
        [[0.0, 1.0, 3.0, 2.0, -1.0], [0.0, 2.0, 1.0, 2.0, 0.0], [-1e4] * 4 + [0.0]]
    )
    tok, lp = ts.sample(logits.to(DEVICE), greedy=True, temperature=_t(7.0))
    assert tok.tolist() == [2, 1, 4]
    # hand: log(e^3 / (1 + e + e^3 + e^2 + e^-1)); log(e^2 / (2 + 2e^2 + e)); log(1 / 1)
    z0 = 3 - math.log(1 + math.e + math.e**3 + math.e**2 + math.exp(-1))
    z1 = 2 - math.log(2 + 2 * math.e**2 + math.e)
    assert lp.cpu().tolist() == pytest.approx([z0, z1, 0.0], abs=1e-5)


def test_frequencies_follow_softmax_at_the_temperature():
    # logits (0, log 2, log 3, -inf-ish) at T = 1 -> p = (1/6, 2/6, 3/6, 0); at T = 0.5 the
    # logits double -> p proportional to (1, 4, 9) / 14
    n = 6000
    row = torch.tensor([0.0, math.log(2), math.log(3), -1e4])
    for temp, want in ((1.0, [1 / 6, 2 / 6, 3 / 6, 0.0]), (0.5, [1 / 14, 4 / 14, 9 / 14, 0.0])):
        logits = row.repeat(n, 1).to(DEVICE)
        tok, lp = ts.sample(logits, greedy=False, temperature=_t(temp), gen=_gen(1))
        freq = torch.bincount(tok.cpu(), minlength=4).double() / n
        # 4 standard errors of a proportion at n = 6000: <= 0.026
        assert freq.tolist() == pytest.approx(want, abs=0.026)
        # each row's log-prob is log_softmax(z / T) of its token (before any filtering)
        ref = torch.log_softmax(row / temp, -1)[tok.cpu()]
        assert torch.allclose(lp.cpu(), ref, atol=1e-5)


def test_a_seed_gives_the_same_tokens_and_the_draws_differ_by_row_and_seed():
    logits = torch.zeros(64, 3000, device=DEVICE)  # uniform over a vocabulary > one block
    a, _ = ts.sample(logits, greedy=False, temperature=_t(1.0), gen=_gen(5))
    b, _ = ts.sample(logits, greedy=False, temperature=_t(1.0), gen=_gen(5))
    c, _ = ts.sample(logits, greedy=False, temperature=_t(1.0), gen=_gen(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert len(set(a.tolist())) > 32  # rows draw their own numbers: 64 uniform draws
    assert a.max() >= 2048  # tokens past the first block are reached


def test_reads_bf16_and_strided_logits():
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(4, 2600, generator=gen) * 3
    logits = wide.to(torch.bfloat16)[:, :2500]  # a row stride of 2600 (not contiguous rows)
    tok, lp = ts.sample(logits.to(DEVICE), greedy=True, temperature=_t(1.0))
    ref = torch.log_softmax(logits.float(), -1)
    assert tok.cpu().tolist() == logits.float().argmax(-1).tolist()
    assert torch.allclose(lp.cpu(), ref.gather(1, tok.cpu()[:, None])[:, 0], atol=1e-4)


@pytest.mark.parametrize("kind,temperature", [("llama", 1.0), ("qwen2", 0.7), ("llama", 0.0)])
def test_the_engine_samples_through_it_with_the_training_forwards_log_probs(kind, temperature):
    """The fast engine on its Triton path with ``fused_sampling`` samples with this kernel
    (no top-p): a seed gives the same answers, and each token's log-prob is the model's log_softmax(logits / T) of
    it (tiny fp32 models; greedy: the torch sampler's tokens)."""
    from danka.rollout.base import SamplingParams
    from danka.rollout.fast.engine import FastEngine
    from danka.rollout.fast.options import FastExperiments, FastOptions

    from .test_fast_engine import fast_run, forward_logprobs, tiny

    model = tiny(kind).to(DEVICE)
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=10)

    def run(seed, fused=True):
        engine = FastEngine(
            FastOptions(attention="triton"),
            FastExperiments(use_cuda_graph=False, fused_sampling=fused),
        )
        out = fast_run(model, params, engine, generator=_gen(seed))
        assert engine._path.fused_sampling is fused
        return out

    out, again = run(3), run(3)
    assert torch.equal(out.response_ids, again.response_ids)
    ref = forward_logprobs(model, out, temperature)
    torch.testing.assert_close(out.rollout_logprobs, ref, atol=1e-4, rtol=0)
    if temperature == 0.0:
        torch_sampler = run(3, fused=False)
        assert torch.equal(out.response_ids, torch_sampler.response_ids)
    else:
        assert len(set(out.response_ids.flatten().tolist())) > 4  # not a constant answer
