"""DAPO's overlong penalty at the buffer edges, by hand."""

from __future__ import annotations

import pytest
import torch

from danka.rewards.shaping import overlong_penalty, response_lengths


def test_overlong_penalty_at_the_edges():
    # max_new_tokens 16, buffer 4 -> expected length 16 - 4 = 12
    lengths = torch.tensor([0, 10, 12, 13, 14, 15, 16, 20])
    out = overlong_penalty(lengths, max_new_tokens=16, buffer=4, penalty=1.0)
    # <= 12: 0; 13: -(13-12)/4 = -0.25; 14: -0.5; 15: -0.75; 16 (the cap): -1; beyond: -1
    assert out.tolist() == pytest.approx([0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0])
    assert out.dtype == torch.float32


def test_overlong_penalty_scales_with_penalty_and_is_off_at_zero_buffer():
    # L = 15: -(15 - 12) / 4 * 0.5 = -0.375
    out = overlong_penalty(torch.tensor([15]), max_new_tokens=16, buffer=4, penalty=0.5)
    assert float(out[0]) == pytest.approx(-0.375)
    off = overlong_penalty(torch.tensor([16, 3]), max_new_tokens=16, buffer=0, penalty=1.0)
    assert off.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), max_new_tokens=16, buffer=16, penalty=1.0)


def test_response_lengths_count_the_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert response_lengths(mask).tolist() == [2.0, 3.0]
