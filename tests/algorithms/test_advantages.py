import math

import pytest
import torch

from danka.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInput, sequence_rewards_to_tokens
from danka.algorithms.advantages import discounted_returns
from danka.errors import UserError

EPS = 1e-6


def _whiten(xs: list[float]) -> list[float]:
    # mean and unbiased variance over the valid entries, then (x - mean) / sqrt(var + 1e-8)
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def test_sequence_rewards_to_tokens_puts_score_on_last_valid_token():
    scores = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    out = sequence_rewards_to_tokens(scores, mask)
    # row 2 has no valid token, so its score goes nowhere
    assert torch.equal(out, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]))


def test_sequence_rewards_to_tokens_skips_holes_of_an_agent_loss_mask():
    # an agent rollout: call turn (2 tokens), tool response (2 tokens, loss 0), answer (2)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    out = sequence_rewards_to_tokens(torch.tensor([5.0, 7.0]), mask)
    # the score sits on the LAST 1 of each row (index 5 and 2), not at sum-1 (3 and 1),
    # which would be a masked tool token and lose the reward
    expect = torch.zeros(2, 7)
    expect[0, 5], expect[1, 2] = 5.0, 7.0
    assert torch.equal(out, expect)
    assert torch.equal((out * mask).sum(-1), torch.tensor([5.0, 7.0]))


def test_gae_gamma_lam_below_one_three_tokens_and_padding():
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 9.0]])  # 9.0 sits on padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    inp = AdvantageInput(rewards, mask, torch.tensor([0, 1]), values, gamma=gamma, lam=lam)
    adv, ret = ADVANTAGE_ESTIMATORS.get("gae")(inp)
    # row 0: delta2 = 1 + 0.9*0 - 0.7 = 0.3                      A2 = 0.3
    #        delta1 = 0 + 0.9*0.7 - 0.6 = 0.03                   A1 = 0.03 + 0.72*0.3 = 0.246
    #        delta0 = 0 + 0.9*0.6 - 0.5 = 0.04                   A0 = 0.04 + 0.72*0.246 = 0.21712
    # row 1: t=2 is padding: no bootstrap from V=9, A stays 0
    #        delta1 = 2 + 0.9*0 - 1 = 1                          A1 = 1
    #        delta0 = 0 + 0.9*1 - 1 = -0.1                       A0 = -0.1 + 0.72*1 = 0.62
    raw = [0.21712, 0.246, 0.3, 0.62, 1.0]
    # returns = A + V before whitening: [0.71712, 0.846, 1.0], [1.62, 2.0, 0 (pad)]
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0], [1.62, 2.0, 0.0]]), atol=1e-6)
    w = _whiten(raw)  # whitened over the 5 valid tokens of the batch
    expected = torch.tensor([[w[0], w[1], w[2]], [w[3], w[4], 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_gae_needs_values():
    inp = AdvantageInput(torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([0]))
    with pytest.raises(UserError, match="needs critic values"):
        ADVANTAGE_ESTIMATORS.get("gae")(inp)


def _grouped_input() -> AdvantageInput:
    # group 7: scores [1, 0, 0]; group 3: identical [1, 1]; group 5: one sample, score 0.5
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    mask = torch.tensor(
        [
            [1.0, 1.0, 1.0],
            [1.0, 0.0, 0.0],
            [1.0, 1.0, 0.0],
            [1.0, 1.0, 1.0],
            [1.0, 0.0, 0.0],
            [1.0, 1.0, 1.0],
        ]
    )
    rewards = sequence_rewards_to_tokens(scores, mask)
    # row 0 also carries a per-token KL penalty: +0.1 - 0.1 + 1.0 still sums to score 1.0
    rewards[0] = torch.tensor([0.1, -0.1, 1.0])
    return AdvantageInput(rewards, mask, torch.tensor([7, 7, 7, 3, 3, 5]))


def _expected(per_seq: list[float], mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(per_seq).unsqueeze(-1) * mask


def test_grpo_groups_identical_and_size_one():
    inp = _grouped_input()
    adv, ret = ADVANTAGE_ESTIMATORS.get("grpo")(inp)
    # group 7: mean 1/3, deviations 2/3, -1/3, -1/3; sum of squares 4/9+1/9+1/9 = 2/3;
    #          unbiased var = (2/3)/2 = 1/3, std = 0.57735 -> A = 1.1547, -0.57735, -0.57735
    std = math.sqrt(1 / 3)
    a7 = [(2 / 3) / (std + EPS), (-1 / 3) / (std + EPS), (-1 / 3) / (std + EPS)]
    # group 3: identical rewards -> std 0 -> A = 0 / (0 + eps) = 0
    # group 5: size 1 -> mean 0, std 1 (verl) -> A = 0.5 / (1 + eps)
    per_seq = a7 + [0.0, 0.0, 0.5 / (1 + EPS)]
    assert torch.allclose(adv, _expected(per_seq, inp.response_mask), atol=1e-5)
    assert ret is None  # critic-free: no critic targets


def test_dr_grpo_no_std_division():
    inp = _grouped_input()
    adv, _ = ADVANTAGE_ESTIMATORS.get("dr_grpo")(inp)
    # group 7: s - 1/3 = 2/3, -1/3, -1/3; group 3: 0, 0; group 5 (size 1): raw 0.5
    per_seq = [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.5]
    assert torch.allclose(adv, _expected(per_seq, inp.response_mask), atol=1e-6)


def test_rloo_leave_one_out():
    inp = _grouped_input()
    adv, _ = ADVANTAGE_ESTIMATORS.get("rloo")(inp)
    # group 7: 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5; 0 - (1+0)/2 = -0.5
    # group 3: 1 - 1/1 = 0 twice; group 5 (size 1): raw score 0.5
    per_seq = [1.0, -0.5, -0.5, 0.0, 0.0, 0.5]
    assert torch.allclose(adv, _expected(per_seq, inp.response_mask), atol=1e-6)


def test_reinforce_plus_plus_discounted_and_whitened():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])  # 5.0 sits on padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    inp = AdvantageInput(rewards, mask, torch.tensor([0, 0]), gamma=0.5)
    adv, ret = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(inp)
    assert ret is None  # critic-free: no critic targets
    # row 0: G = [0.5*0.5*1, 0.5*1, 1] = [0.25, 0.5, 1]
    # row 1: G2 (pad) masked, no carry-over; G1 = 2, G0 = 0 + 0.5*2 = 1
    g = discounted_returns(rewards, mask, 0.5)
    assert torch.allclose(g, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    # whiten [0.25, 0.5, 1, 1, 2]: mean 4.75/5 = 0.95, deviations -0.7 -0.45 0.05 0.05 1.05,
    # squares sum 0.49+0.2025+0.0025+0.0025+1.1025 = 1.8, unbiased var = 1.8/4 = 0.45
    s = math.sqrt(0.45 + 1e-8)
    expected = torch.tensor([[-0.7 / s, -0.45 / s, 0.05 / s], [0.05 / s, 1.05 / s, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_reinforce_plus_plus_baseline():
    # group 0: scores [1, 0] -> centred [0.5, -0.5]; group 1: size 1, baseline 0 -> 2
    scores = torch.tensor([1.0, 0.0, 2.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    inp = AdvantageInput(sequence_rewards_to_tokens(scores, mask), mask, torch.tensor([0, 0, 1]))
    adv, ret = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus_baseline")(inp)
    # valid tokens [0.5, 0.5, -0.5, 2]: mean 2.5/4 = 0.625, deviations -0.125 -0.125 -1.125 1.375,
    # squares sum 0.015625*2 + 1.265625 + 1.890625 = 3.1875, unbiased var = 3.1875/3 = 1.0625
    s = math.sqrt(1.0625 + 1e-8)
    expected = torch.tensor([[-0.125 / s, -0.125 / s], [-1.125 / s, 0.0], [1.375 / s, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    assert ret is None  # critic-free: no critic targets


def test_estimators_do_not_track_gradients():
    values = torch.ones(2, 2, requires_grad=True)
    rewards = torch.ones(2, 2, requires_grad=True)
    inp = AdvantageInput(rewards, torch.ones(2, 2), torch.tensor([0, 0]), values)
    for name in ADVANTAGE_ESTIMATORS.names():
        adv, ret = ADVANTAGE_ESTIMATORS.get(name)(inp)
        assert not adv.requires_grad and (ret is None or not ret.requires_grad), name
        # returns are critic targets, and only estimators that need a critic make them
        assert (ret is not None) == ADVANTAGE_ESTIMATORS.meta(name).needs_critic, name


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="group_index"):
        AdvantageInput(torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([0, 1, 2]))


def test_skipped_sample_is_left_out_of_its_group():
    # issue 11 #4: rewards [1, 1, 0, skipped] in one group. Counting the skipped sample as 0:
    # mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> A_0 = 0.5 / 0.57735 = 0.866.
    # Without it: [1, 1, 0], mean 2/3, deviations 1/3, 1/3, -2/3, sum of squares 6/9,
    # var (6/9) / 2 = 1/3, std 0.57735 -> A = 0.57735, 0.57735, -1.1547; the skipped one 0.
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0])
    mask = torch.ones(4, 2)
    valid = torch.tensor([True, True, True, False])
    inp = AdvantageInput(
        sequence_rewards_to_tokens(scores, mask), mask, torch.zeros(4, dtype=torch.long),
        valid=valid,
    )  # fmt: skip
    adv, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inp)
    s = math.sqrt(1 / 3) + EPS
    expected = torch.tensor([1 / 3 / s, 1 / 3 / s, -2 / 3 / s, 0.0]).unsqueeze(-1) * mask
    assert torch.allclose(adv, expected, atol=1e-5)
    assert adv[0, 0] == pytest.approx(0.57735, abs=1e-4)  # was 0.866


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_grouped_estimators_ignore_invalid_members(name):
    # an invalid member with an outlier score changes nothing for the others
    mask = torch.ones(4, 3)
    group = torch.zeros(4, dtype=torch.long)
    valid = torch.tensor([True, True, True, False])
    est = ADVANTAGE_ESTIMATORS.get(name)
    assert ADVANTAGE_ESTIMATORS.meta(name).grouped
    a, _ = est(AdvantageInput(
        sequence_rewards_to_tokens(torch.tensor([1.0, 0.0, 0.5, 0.0]), mask), mask, group,
        valid=valid,
    ))  # fmt: skip
    b, _ = est(AdvantageInput(
        sequence_rewards_to_tokens(torch.tensor([1.0, 0.0, 0.5, 99.0]), mask), mask, group,
        valid=valid,
    ))  # fmt: skip
    assert torch.allclose(a, b) and (a[3] == 0).all()


def test_gae_with_zero_rewards_and_constant_values_pushes_the_last_token_down():
    # the mechanism of issue 11 #10, by hand: V = 0.03 everywhere, rewards 0, gamma 1,
    # lam 1: delta_t = V_{t+1} - V_t = 0 for t < T, delta_T = 0 - 0.03; A_t = -0.03 on
    # every token (telescoping), but with lam 0.95, A_t = -0.03 * 0.95^(T - t): the last
    # (end-of-turn) token gets the most negative advantage. V = 0 (a zero-initialised head)
    # gives A = 0 exactly.
    mask = torch.ones(1, 4)
    zero = torch.zeros(1, 4)
    inp = AdvantageInput(zero, mask, torch.zeros(1, dtype=torch.long), 0.03 * mask, lam=0.95,
                         whiten=False)  # fmt: skip
    adv, _ = ADVANTAGE_ESTIMATORS.get("gae")(inp)
    expected = -0.03 * torch.tensor([[0.95**3, 0.95**2, 0.95, 1.0]])
    assert torch.allclose(adv, expected, atol=1e-7)
    inp = AdvantageInput(zero, mask, torch.zeros(1, dtype=torch.long), zero.clone(), lam=0.95)
    adv, ret = ADVANTAGE_ESTIMATORS.get("gae")(inp)
    assert torch.equal(adv, zero) and torch.equal(ret, zero)


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_batch_whitening_goes_through_the_injected_whitener(name):
    """The trainer injects a whitener whose statistics span every rank; the estimators must
    call it (not masked_whiten directly). A whitener returning 2 * values - 1 everywhere:
    the advantage is that, zeroed on padding."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    seen = []

    def whitener(values, m):
        seen.append(m.clone())
        return 2 * values - 1

    inp = AdvantageInput(
        token_rewards=torch.tensor([[0.0, 1.0], [3.0, 0.0]]),
        response_mask=mask,
        group_index=torch.tensor([0, 0]),
        values=torch.zeros(2, 2),
        whitener=whitener,
    )
    adv, _ = ADVANTAGE_ESTIMATORS.get(name)(inp)
    # gamma = lam = 1, V = 0: gae's A and REINFORCE++'s G are the returns-to-go [[1, 1], [3, 0]];
    # the baseline variant centres the sequence scores (1, 3) on their mean 2: [[-1, -1], [1, 0]]
    raw = torch.tensor([[-1.0, -1.0], [1.0, 0.0]]) if "baseline" in name else None
    raw = torch.tensor([[1.0, 1.0], [3.0, 0.0]]) if raw is None else raw
    assert len(seen) == 1 and torch.equal(seen[0], mask)
    torch.testing.assert_close(adv, (2 * raw - 1) * mask)


GROUPED = ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("name", GROUPED)
@pytest.mark.parametrize("value", [0.1, 1.6])
def test_equal_rewards_give_exactly_zero_advantage(name, value):
    # eight samples all scored 1.6 (strict 1 + flexible 0.5 + format 0.1) in float32:
    # sum 12.8 -> mean 1.6000001 (float32), s - mean = -1.19e-7 on every sample, unbiased
    # std 1.27e-7, so the naive GRPO value is -1.19e-7 / (1.27e-7 + 1e-6) = -0.106 per token
    # (for 0.1: -7.45e-9 / (7.97e-9 + 1e-6) = -0.0074). max - min = 0 <= 1e-6: exactly 0.
    scores = torch.full((8,), value)
    mask = torch.ones(8, 5)
    mask[3, 2:] = 0.0  # lengths differ: the baseline variant's token-weighted mean is not 0
    inp = AdvantageInput(sequence_rewards_to_tokens(scores, mask), mask, torch.zeros(8).long())
    adv, _ = ADVANTAGE_ESTIMATORS.get(name)(inp)
    assert torch.equal(adv, torch.zeros(8, 5))
    naive = (scores - scores.mean()) / (scores.std() + EPS)
    assert value != 1.6 or naive[0].item() == pytest.approx(-0.106, abs=0.01)


def test_flat_group_next_to_an_informative_one():
    # group 0: [1, 0] -> grpo mean 0.5, unbiased std sqrt(0.5) = 0.70711, A = +-0.70711;
    # group 1: [0.3, 0.3 + 4e-7] spans 4e-7 <= 1e-6: rounding, not signal -> A = 0 (naive:
    # +-2e-7 / (2.8e-7 + 1e-6) = +-0.16)
    scores = torch.tensor([1.0, 0.0, 0.3, 0.3 + 4e-7], dtype=torch.float64)
    mask = torch.ones(4, 2, dtype=torch.float64)
    inp = AdvantageInput(sequence_rewards_to_tokens(scores, mask), mask, torch.tensor([0, 0, 1, 1]))
    adv, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inp)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    expected = torch.tensor([a, -a, 0.0, 0.0], dtype=torch.float64).unsqueeze(-1) * mask
    assert torch.allclose(adv, expected, atol=1e-6)
    assert (adv[2:] == 0).all()


def test_flat_group_counts_only_valid_members():
    # group [1, 1, skipped 0]: the two valid members are equal -> 0 exactly; a size-1
    # group (one valid member) keeps verl's raw score: 0.5 / (1 + eps)
    scores = torch.tensor([1.0, 1.0, 0.0, 0.5])
    mask = torch.ones(4, 1)
    valid = torch.tensor([True, True, False, True])
    inp = AdvantageInput(
        sequence_rewards_to_tokens(scores, mask), mask, torch.tensor([0, 0, 0, 1]), valid=valid
    )
    adv, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inp)
    assert adv[:3].eq(0).all() and adv[3, 0].item() == pytest.approx(0.5 / (1 + EPS))


def test_baseline_variant_leaves_flat_groups_out_of_the_whitening():
    # group 0: [1, 0] -> centred [0.5, -0.5], one token each; group 1: [2, 2] flat, 3 tokens
    # each. Whitened over group 0's two tokens only: mean 0, unbiased var 0.5 -> +-0.70711;
    # were group 1's six zeros included, the mean would stay 0 but the var would be
    # 0.5 / 7 and group 0 would get +-1.87.
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0])
    mask = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [1.0, 1, 1], [1.0, 1, 1]])
    inp = AdvantageInput(sequence_rewards_to_tokens(scores, mask), mask, torch.tensor([0, 0, 1, 1]))
    adv, _ = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus_baseline")(inp)
    s = math.sqrt(0.5 + 1e-8)
    expected = torch.tensor([[0.5 / s, 0, 0], [-0.5 / s, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(adv, expected, atol=1e-6)
