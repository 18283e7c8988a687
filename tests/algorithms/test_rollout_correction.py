"""Rollout/trainer mismatch correction: hand-worked weights, masks and metrics."""

import math

import pytest
import torch

from danka.algorithms.rollout_correction import ROLLOUT_CORRECTIONS


def _logps():
    # token ratios pi_old / pi_rollout = exp(old - rollout):
    # row 0: log ratios [ln 2, ln 4, 0]      -> ratios [2, 4, 1]
    # row 1: log ratios [ln 0.5, 0, (pad)]   -> ratios [0.5, 1]
    rollout = torch.zeros(2, 3)
    old = torch.tensor([[math.log(2), math.log(4), 0.0], [math.log(0.5), 0.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return old, rollout, mask


def test_token_tis_truncates_at_the_cap_and_reports_before_clipping():
    old, rollout, mask = _logps()
    out = ROLLOUT_CORRECTIONS.get("token_tis")(old, rollout, mask, 3.0)
    # min(ratio, 3): [2, 3, 1], [0.5, 1, 0 (pad)]
    assert torch.allclose(out.weights, torch.tensor([[2.0, 3.0, 1.0], [0.5, 1.0, 0.0]]))
    assert out.keep.all()
    # before clipping: mean of [2, 4, 1, 0.5, 1] = 8.5 / 5 = 1.7, max 4, 1 of 5 above 3
    assert out.metrics["rollout_is/mean"] == pytest.approx(1.7)
    assert out.metrics["rollout_is/max"] == pytest.approx(4.0)
    assert out.metrics["rollout_is/clipped_frac"] == pytest.approx(0.2)


def test_seq_mask_drops_sequences_outside_the_threshold():
    old, rollout, mask = _logps()
    out = ROLLOUT_CORRECTIONS.get("seq_mask")(old, rollout, mask, 2.0)
    # sequence ratios: row 0 = 2 * 4 * 1 = 8 > 2 -> dropped; row 1 = 0.5 * 1 = 0.5 >= 1/2 -> kept
    assert out.keep.tolist() == [False, True]
    assert torch.equal(out.weights, mask)
    assert out.metrics["rollout_is/mean"] == pytest.approx((8 + 0.5) / 2)
    assert out.metrics["rollout_is/max"] == pytest.approx(8.0)
    assert out.metrics["rollout_is/masked_frac"] == pytest.approx(0.5)


def test_none_is_no_correction():
    assert "none" in ROLLOUT_CORRECTIONS and ROLLOUT_CORRECTIONS.get("none") is None
