import math

import pytest
import torch

from danka.algorithms import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
)
from danka.errors import UserError

P = torch.tensor([[-1.0, -2.0]])  # log p (policy)
Q = torch.tensor([[-1.5, -1.0]])  # log q (reference); log p - log q = [0.5, -1.0]


def test_k1_k2_abs():
    assert torch.allclose(KL_ESTIMATORS.get("k1")(P, Q), torch.tensor([[0.5, -1.0]]))
    # 0.5 * 0.5^2 = 0.125; 0.5 * 1^2 = 0.5
    assert torch.allclose(KL_ESTIMATORS.get("k2")(P, Q), torch.tensor([[0.125, 0.5]]))
    assert torch.allclose(KL_ESTIMATORS.get("abs")(P, Q), torch.tensor([[0.5, 1.0]]))


def test_k3_values_and_clamps():
    # q - p = [-0.5, 1.0]: exp(-0.5) + 0.5 - 1 = 0.106531; exp(1) - 1 - 1 = 0.718282
    expected = torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0]])
    assert torch.allclose(KL_ESTIMATORS.get("k3")(P, Q), expected, atol=1e-6)
    # q - p = 30 -> clamped to 20 -> e^20 - 21, clamped to 10
    # q - p = -30 -> clamped to -20 -> e^-20 + 20 - 1 = 19, clamped to 10
    out = KL_ESTIMATORS.get("k3")(torch.tensor([[0.0, 30.0]]), torch.tensor([[30.0, 0.0]]))
    assert torch.equal(out, torch.tensor([[10.0, 10.0]]))


def test_estimators_zero_when_equal():
    for name in KL_ESTIMATORS.names():
        assert torch.equal(KL_ESTIMATORS.get(name)(P, P), torch.zeros_like(P)), name


def test_fixed_controller():
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=64)
    assert ctl.value == 0.05
    other = FixedKLController(0.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_update_and_state():
    ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    # e = clip(9/6 - 1 = 0.5, -0.2, 0.2) = 0.2; mult = 1 + 0.2 * 100/10000 = 1.002
    ctl.update(current_kl=9.0, n_steps=100)
    assert math.isclose(ctl.value, 0.1002, rel_tol=1e-12)
    # e = 5.4/6 - 1 = -0.1; mult = 1 - 0.1 * 1000/10000 = 0.99 -> 0.1002 * 0.99 = 0.099198
    ctl.update(current_kl=5.4, n_steps=1000)
    assert math.isclose(ctl.value, 0.099198, rel_tol=1e-12)
    restored = AdaptiveKLController(init_coef=1.0, target=1.0, horizon=1.0)
    restored.load_state_dict(ctl.state_dict())
    assert (restored.value, restored.target, restored.horizon) == (ctl.value, 6.0, 10000.0)


def test_adaptive_controller_rejects_bad_target():
    with pytest.raises(UserError, match="target > 0"):
        AdaptiveKLController(0.1, target=0.0, horizon=100)


def test_apply_kl_in_reward():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logp = torch.full((2, 3), -1.0)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, -9.0]])  # -9 sits on padding
    out, mean_kl = apply_kl_in_reward(rewards, logp, ref, mask, "k1", coef=0.1)
    # k1 = logp - ref: row 0 [0.5, 0, -0.5]; row 1 [1.0, 0, (8.0 masked to 0)]
    # rewards - 0.1 * kl: row 0 [-0.05, 0, 1.05]; row 1 [-0.1, 2, 0]
    assert torch.allclose(out, torch.tensor([[-0.05, 0.0, 1.05], [-0.1, 2.0, 0.0]]))
    # per-sequence mean: row 0 0/3 = 0, row 1 1/2 = 0.5 -> mean 0.25
    assert math.isclose(mean_kl, 0.25, rel_tol=1e-6)


def test_apply_kl_unknown_estimator():
    with pytest.raises(UserError, match="unknown KL estimator 'k4'"):
        apply_kl_in_reward(torch.zeros(1, 1), P[:, :1], Q[:, :1], torch.ones(1, 1), "k4", 0.1)
