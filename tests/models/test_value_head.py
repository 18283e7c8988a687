"""Value head: shape, small init, safetensors round trip, mismatch errors."""

import pytest
import torch

from danka.errors import UserError
from danka.models.value_head import ValueHead, load_value_head, save_value_head


def test_value_head_shapes_and_small_init():
    torch.manual_seed(0)
    head = ValueHead(16)
    values = head(torch.randn(2, 3, 16, dtype=torch.bfloat16))
    assert values.shape == (2, 3, 1) and values.dtype == torch.float32
    assert head.linear.weight.abs().max() < 0.01 and head.linear.bias.item() == 0.0


def test_save_load_round_trip(tmp_path):
    head = ValueHead(8)
    with torch.no_grad():
        head.linear.weight.copy_(torch.arange(8.0)[None])
        head.linear.bias.fill_(0.5)
    save_value_head(head, tmp_path / "critic")
    loaded = load_value_head(tmp_path / "critic", 8)
    x = torch.ones(1, 8)
    assert loaded(x).item() == pytest.approx(28.5)  # 0+1+...+7 = 28, + 0.5
    assert load_value_head(tmp_path / "critic").hidden_size == 8  # size read from the file


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="no value head"):
        load_value_head(tmp_path, 8)
    save_value_head(ValueHead(8), tmp_path)
    with pytest.raises(UserError, match=r"expected \(1, 4\)"):
        load_value_head(tmp_path, 4)


def test_fresh_value_head_gives_zero_eos_advantage_under_zero_rewards():
    # issue 11 #10: with rewards 0 the end-of-turn token's GAE advantage must be exactly 0
    # for a fresh head (a head predicting V_T = c gave it delta_T = -c every step)
    from danka.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInput

    head = ValueHead(16)
    hidden = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0))
    values = head(hidden).squeeze(-1)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0]])
    inp = AdvantageInput(torch.zeros(3, 5), mask, torch.arange(3), values * mask)
    adv, returns = ADVANTAGE_ESTIMATORS.get("gae")(inp)
    eos = mask.sum(1).long() - 1
    assert (adv[torch.arange(3), eos] == 0).all() and (adv == 0).all()
    assert (returns == 0).all()
