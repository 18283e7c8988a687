"""Bradley-Terry loss and held-out pair statistics, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from danka.rm.loss import bradley_terry_loss, pair_stats

R_C = torch.tensor([2.0, 0.0])
R_R = torch.tensor([0.0, 1.0])


def test_bradley_terry_loss_by_hand():
    # diffs r_c - r_r = [2, -1]
    # -log sigmoid(2)  = log(1 + e^-2) = 0.126928
    # -log sigmoid(-1) = log(1 + e^1)  = 1.313262
    # mean = (0.126928 + 1.313262) / 2 = 0.720095
    assert float(bradley_terry_loss(R_C, R_R)) == pytest.approx(0.720095, abs=1e-5)
    expected = (math.log1p(math.exp(-2)) + math.log1p(math.exp(1))) / 2
    assert float(bradley_terry_loss(R_C, R_R)) == pytest.approx(expected, abs=1e-6)


def test_margin_and_centering_by_hand():
    # margin [1, 0]: diffs [2 - 1, -1] = [1, -1]
    # log(1 + e^-1) = 0.313262, log(1 + e^1) = 1.313262 -> mean 0.813262
    margin = torch.tensor([1.0, 0.0])
    assert float(bradley_terry_loss(R_C, R_R, margin)) == pytest.approx(0.813262, abs=1e-5)
    # centering 0.1 * mean((r_c + r_r)^2) = 0.1 * mean([4, 1]) = 0.25 -> 0.720095 + 0.25
    loss = bradley_terry_loss(R_C, R_R, center_coef=0.1)
    assert float(loss) == pytest.approx(0.970095, abs=1e-5)
    # a 0 or None coefficient adds nothing
    assert float(bradley_terry_loss(R_C, R_R, center_coef=0.0)) == pytest.approx(0.720095, 1e-5)


def test_loss_gradient_raises_chosen_and_lowers_rejected():
    r_c, r_r = R_C.clone().requires_grad_(), R_R.clone().requires_grad_()
    bradley_terry_loss(r_c, r_r).backward()
    assert (r_c.grad < 0).all() and (r_r.grad > 0).all()  # descent raises r_c, lowers r_r


def test_pair_stats_by_hand():
    s = pair_stats(R_C, R_R)
    # 2 > 0 right, 0 > 1 wrong -> accuracy 1/2; margin mean(2, -1) = 0.5
    assert s["accuracy"] == 0.5 and s["margin"] == pytest.approx(0.5) and s["n"] == 2
    # all rewards [2, 0, 0, 1]: mean 0.75; squared deviations 1.5625 + 0.5625 + 0.5625 +
    # 0.0625 = 2.75, / (4 - 1) = 0.916667, sqrt = 0.957427
    assert s["mean"] == pytest.approx(0.75) and s["std"] == pytest.approx(0.957427, abs=1e-5)


def test_a_tie_counts_as_wrong():
    assert pair_stats(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0]))["accuracy"] == 0.5
