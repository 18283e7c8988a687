import math

import pytest
import torch

from danka.algorithms import AGG_MODES, POLICY_LOSSES, value_loss
from danka.algorithms.losses import LossNorm, PolicyLossInput, PolicyLossParams, aggregate
from danka.errors import UserError


def _inputs(ratios: list[float], advs: list[float]):
    """One sequence; old log-probs -1, new log-probs -1 + log(ratio)."""
    old = torch.full((1, len(ratios)), -1.0)
    new = (old + torch.log(torch.tensor([ratios]))).requires_grad_(True)
    adv = torch.tensor([advs])
    mask = torch.ones(1, len(ratios))
    return new, old, adv, mask, LossNorm.from_mask(mask)


# ---------------------------------------------------------------- aggregation


def test_aggregate_modes():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # valid: 1, 2 | 4
    norm = LossNorm(num_tokens=3, num_seqs=2, max_response_length=3)
    expected = {
        "token-mean": 7 / 3,  # (1 + 2 + 4) / 3 tokens
        "seq-mean-token-sum": 3.5,  # (3 + 4) / 2 seqs
        "seq-mean-token-mean": 2.75,  # (3/2 + 4/1) / 2 = (1.5 + 4) / 2
        "seq-mean-token-sum-norm": 7 / 6,  # 7 / (2 seqs * 3 max length)
    }
    assert set(expected) == set(AGG_MODES)
    for mode, value in expected.items():
        assert math.isclose(aggregate(x, m, mode, norm).item(), value, rel_tol=1e-6), mode


def test_aggregate_uses_global_counts():
    # this micro-batch is part of a mini-batch of 6 tokens / 4 seqs: (1 + 2 + 4) / 6
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    norm = LossNorm(num_tokens=6, num_seqs=4, max_response_length=3)
    assert math.isclose(aggregate(x, m, "token-mean", norm).item(), 7 / 6, rel_tol=1e-6)
    assert math.isclose(aggregate(x, m, "seq-mean-token-sum", norm).item(), 7 / 4, rel_tol=1e-6)


def test_aggregate_unknown_mode():
    with pytest.raises(UserError) as info:
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "token-sum", LossNorm(1, 1, 1))
    assert "seq-mean-token-sum-norm" in info.value.fix


# ---------------------------------------------------------------- vanilla PPO


def test_vanilla_ppo_clip_values_and_gradients():
    # a: A=+1 r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped)    b: A=+1 r=0.5 -> max(-0.5, -0.8) = -0.5
    # c: A=-1 r=0.5 -> max(0.5, 0.8) = 0.8 (clipped)       d: A=-1 r=1.5 -> max(1.5, 1.2) = 1.5
    new, old, adv, mask, norm = _inputs([1.5, 0.5, 0.5, 1.5], [1.0, 1.0, -1.0, -1.0])
    params = PolicyLossParams(dual_clip_c=None)
    loss, metrics = POLICY_LOSSES.get("vanilla")(PolicyLossInput(new, old, adv, mask), params, norm)
    assert math.isclose(loss.item(), (-1.2 - 0.5 + 0.8 + 1.5) / 4, rel_tol=1e-6)  # 0.15
    assert metrics["clipfrac"] == 0.5  # a and c
    assert math.isclose(metrics["ratio_mean"], 1.0, rel_tol=1e-6)  # (1.5+0.5+0.5+1.5)/4
    # k3 = r - 1 - log r: 1.5 -> 0.5 - 0.405465 = 0.094535; 0.5 -> -0.5 + 0.693147 = 0.193147
    assert math.isclose(metrics["approx_kl"], (2 * 0.094535 + 2 * 0.193147) / 4, rel_tol=1e-4)
    loss.backward()
    # d loss / d logp = -A * r / 4 where unclipped, 0 where clipped: [0, -0.125, 0, 0.375]
    assert torch.allclose(new.grad, torch.tensor([[0.0, -0.125, 0.0, 0.375]]), atol=1e-6)


def test_vanilla_dual_clip_triggers_only_for_negative_advantages():
    # A=-1 r=5: max(5, 1.2) = 5 -> dual clip min(5, 3*1) = 3 (triggered)
    # A=-1 r=2: max(2, 1.2) = 2 -> min(2, 3) = 2
    # A=+1 r=5: max(-5, -1.2) = -1.2, dual clip not applied to A > 0
    new, old, adv, mask, norm = _inputs([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0])
    fn = POLICY_LOSSES.get("vanilla")
    loss, metrics = fn(
        PolicyLossInput(new, old, adv, mask), PolicyLossParams(dual_clip_c=3.0), norm
    )
    assert math.isclose(loss.item(), (3.0 + 2.0 - 1.2) / 3, rel_tol=1e-6)
    assert math.isclose(metrics["clipfrac_lower"], 1 / 3, rel_tol=1e-6)
    loss.backward()
    # dual-clipped and ratio-clipped tokens get no gradient; token 2: -A r / 3 = 2/3
    assert torch.allclose(new.grad, torch.tensor([[0.0, 2 / 3, 0.0]]), atol=1e-6)
    off, _ = fn(PolicyLossInput(new, old, adv, mask), PolicyLossParams(dual_clip_c=None), norm)
    assert math.isclose(off.item(), (5.0 + 2.0 - 1.2) / 3, rel_tol=1e-6)


def test_vanilla_clip_higher_asymmetric():
    # clip range [0.8, 1.28]: A=+1 r=1.25 -> -1.25 (inside); A=+1 r=1.4 -> -1.28;
    # A=-1 r=0.75 -> max(0.75, 0.8) = 0.8
    new, old, adv, mask, norm = _inputs([1.25, 1.4, 0.75], [1.0, 1.0, -1.0])
    fn = POLICY_LOSSES.get("vanilla")
    loss, _ = fn(
        PolicyLossInput(new, old, adv, mask), PolicyLossParams(clip_low=0.2, clip_high=0.28), norm
    )
    assert math.isclose(loss.item(), (-1.25 - 1.28 + 0.8) / 3, rel_tol=1e-6)
    # symmetric 0.2 clips both positive tokens at 1.2: (-1.2 - 1.2 + 0.8) / 3
    sym, _ = fn(PolicyLossInput(new, old, adv, mask), PolicyLossParams(), norm)
    assert math.isclose(sym.item(), (-1.2 - 1.2 + 0.8) / 3, rel_tol=1e-6)


def test_vanilla_log_ratio_clamp_keeps_loss_finite():
    old = torch.tensor([[-120.0]])
    new = torch.tensor([[-20.0]])  # log-ratio 100 -> clamped to 20
    mask = torch.ones(1, 1)
    params = PolicyLossParams(dual_clip_c=None)
    loss, _ = POLICY_LOSSES.get("vanilla")(
        PolicyLossInput(new, old, torch.tensor([[-1.0]]), mask), params, LossNorm.from_mask(mask)
    )
    assert math.isclose(loss.item(), math.exp(20), rel_tol=1e-5)  # -A * e^20


# ---------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_values_and_gradients():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.1, 0.3, 0.0], [-0.1, 0.05, 5.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # 5.0 is padding
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    params = PolicyLossParams(clip_low=0.1, clip_high=0.1, agg_mode="seq-mean-token-mean")
    loss, metrics = POLICY_LOSSES.get("gspo")(
        PolicyLossInput(new, old, adv, mask), params, LossNorm.from_mask(mask)
    )
    # seq 0: s = exp((0.1 + 0.3)/2) = exp(0.2) = 1.221403, A=+1 -> max(-1.2214, -1.1) = -1.1
    # seq 1: s = exp((-0.1 + 0.05)/2) = exp(-0.025) = 0.975310, A=-1 -> inside clip -> 0.975310
    # seq-mean-token-mean: (-1.1 + 0.975310) / 2
    s1 = math.exp(-0.025)
    assert math.isclose(loss.item(), (-1.1 + s1) / 2, rel_tol=1e-5)
    assert metrics["clipfrac"] == 0.5  # both tokens of seq 0, of 4 valid
    assert math.isclose(metrics["ratio_mean"], (math.exp(0.2) + s1) / 2, rel_tol=1e-5)
    loss.backward()
    # seq 0 clipped -> 0; seq 1 (GSPO-token): -A * s * (1/2 token mean) * (1/2 seqs) = s/4
    expected = torch.tensor([[0.0, 0.0, 0.0], [s1 / 4, s1 / 4, 0.0]])
    assert torch.allclose(new.grad, expected, atol=1e-6)


# ---------------------------------------------------------------- micro-batch invariance


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_name", ["vanilla", "gspo"])
def test_micro_batches_sum_to_the_mini_batch(loss_name, mode):
    gen = torch.Generator().manual_seed(0)
    b, r = 6, 5
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = (torch.arange(r).unsqueeze(0) < lengths.unsqueeze(1)).float()
    old = -torch.rand(b, r, generator=gen) * 2
    base = old + 0.3 * torch.randn(b, r, generator=gen)
    adv = torch.randn(b, 1, generator=gen).expand(b, r) * mask
    params = PolicyLossParams(agg_mode=mode)
    norm = LossNorm.from_mask(mask, max_response_length=8)
    fn = POLICY_LOSSES.get(loss_name)

    whole_in = base.clone().requires_grad_(True)
    whole, _ = fn(PolicyLossInput(whole_in, old, adv, mask), params, norm)
    whole.backward()

    micro_in = base.clone().requires_grad_(True)
    total = torch.zeros(())
    for rows in (slice(0, 2), slice(2, 6)):  # uneven micro-batches
        part, _ = fn(
            PolicyLossInput(micro_in[rows], old[rows], adv[rows], mask[rows]), params, norm
        )
        part.backward()
        total = total + part.detach()
    assert torch.allclose(total, whole.detach(), atol=1e-6)
    assert torch.allclose(micro_in.grad, whole_in.grad, atol=1e-6)


def test_value_loss_micro_batch_invariance():
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    old = torch.randn(3, 3, generator=gen)
    returns = torch.randn(3, 3, generator=gen)
    base = old + 0.5 * torch.randn(3, 3, generator=gen)
    norm = LossNorm.from_mask(mask)
    whole, _ = value_loss(base, old, returns, mask, 0.2, norm)
    parts = sum(
        value_loss(base[s], old[s], returns[s], mask[s], 0.2, norm)[0]
        for s in (slice(0, 1), slice(1, 3))
    )
    assert torch.allclose(parts, whole, atol=1e-6)


# ---------------------------------------------------------------- value loss, params


def test_value_loss_clipped():
    values = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    old = torch.tensor([[0.5, 1.0, 0.5]])
    returns = torch.tensor([[1.2, 0.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, metrics = value_loss(values, old, returns, mask, 0.2, LossNorm.from_mask(mask))
    # t0: v_clip = 0.5 + 0.2 = 0.7; (1 - 1.2)^2 = 0.04 vs (0.7 - 1.2)^2 = 0.25 -> 0.25 (clipped)
    # t1: v_clip = 1.0 + 0.2 = 1.2; (2 - 0)^2 = 4 vs 1.2^2 = 1.44 -> 4
    # t2: v_clip = 0.5; (0.5 - 1)^2 = 0.25 both -> 0.25
    # loss = 0.5 * (0.25 + 4 + 0.25) / 3 = 0.75
    assert math.isclose(loss.item(), 0.75, rel_tol=1e-6)
    assert math.isclose(metrics["vf_clipfrac"], 1 / 3, rel_tol=1e-6)
    assert math.isclose(metrics["vpred_mean"], 3.5 / 3, rel_tol=1e-6)
    loss.backward()
    # t0: the clipped error wins and v_clip is constant in v -> gradient 0
    # t1: unclipped wins -> d/dv 0.5 * (v - 0)^2 / 3 = 0.5 * 2 * 2 / 3 = 2/3
    assert math.isclose(values.grad[0, 0].item(), 0.0, abs_tol=1e-7)
    assert math.isclose(values.grad[0, 1].item(), 2 / 3, rel_tol=1e-6)


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"dual_clip_c": 0.5}, "dual_clip_c"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
        ({"agg_mode": "mean"}, "aggregation mode"),
    ],
)
def test_params_validation(kwargs, text):
    with pytest.raises(UserError, match=text):
        PolicyLossParams(**kwargs)


def test_ratio_mean_of_a_micro_batch_without_trained_tokens_is_one():
    # on-policy (ratio 1 everywhere), four micro-batches of 4 sequences, the last one all
    # truncated and masked (trainer.mask_truncated; micro-batches are length-sorted, so the
    # cut answers land together). The update sums micro-batch metrics weighted by their
    # share of sequences (1/4 each): masked_mean's 0 for the empty one gave
    # 1/4 * (1 + 1 + 1 + 0) = 0.75; with 1.0 for "no tokens, no move" it is 1.0.
    params = PolicyLossParams()
    total = 0.0
    for k in range(4):
        lp = torch.full((4, 3), -1.0, requires_grad=True)
        mask = torch.zeros(4, 3) if k == 3 else torch.ones(4, 3)
        norm = LossNorm(num_tokens=36.0, num_seqs=12.0, max_response_length=3)
        x = PolicyLossInput(lp, lp.detach(), torch.zeros(4, 3), mask)
        _, m = POLICY_LOSSES.get("vanilla")(x, params, norm)
        total += 0.25 * float(m["ratio_mean"])
    assert total == pytest.approx(1.0)
