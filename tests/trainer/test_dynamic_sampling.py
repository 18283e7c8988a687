"""Dynamic sampling (DAPO / verl filter_groups), concat_batches and truncated masking."""

from __future__ import annotations

import pytest
import torch

from danka.config import load_config
from danka.errors import UserError
from danka.trainer.dynamic_sampling import (
    DynamicSampler,
    concat_batches,
    informative_groups,
    mask_truncated,
    mask_truncated_samples,
    select_groups,
)
from danka.types import RolloutBatch

PAD = 0


def _batch(group_rewards: list[list[float]], prompt_len: int = 2, resp_len: int = 3):
    """One group per inner list; sample k of group g has response ids filled with 10g+k."""
    rewards = [r for g in group_rewards for r in g]
    groups = [g for g, rs in enumerate(group_rewards) for _ in rs]
    b = len(rewards)
    ids = torch.tensor([[10 * g + k] * resp_len for g, rs in enumerate(group_rewards)
                        for k in range(len(rs))])  # fmt: skip
    return RolloutBatch(
        prompt_ids=torch.full((b, prompt_len), 7),
        prompt_mask=torch.ones(b, prompt_len, dtype=torch.long),
        response_ids=ids,
        response_mask=torch.ones(b, resp_len),
        group_index=torch.tensor(groups),
        truncated=torch.zeros(b, dtype=torch.bool),
        rewards=torch.tensor(rewards),
    )


def test_informative_groups_need_two_valid_differing_rewards():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert informative_groups(rewards, groups).tolist() == [False, True, False]
    # with sample 2 invalid, group 1 has one valid sample left: not informative
    valid = torch.tensor([True, True, False, True, True, True])
    assert informative_groups(rewards, groups, valid).tolist() == [False, False, False]


def test_concat_pads_prompts_left_responses_right_and_renumbers_groups():
    a = _batch([[1.0, 0.0]], prompt_len=2, resp_len=3)
    b = _batch([[0.0, 1.0], [1.0, 1.0]], prompt_len=4, resp_len=5)
    a.rollout_logprobs = torch.full((2, 3), -1.0)
    b.rollout_logprobs = torch.full((4, 5), -2.0)
    out = concat_batches([a, b], pad_id=PAD)
    assert out.prompt_ids.shape == (6, 4) and out.response_ids.shape == (6, 5)
    assert out.prompt_ids[0].tolist() == [PAD, PAD, 7, 7]  # left padded
    assert out.prompt_mask[0].tolist() == [0, 0, 1, 1]
    assert out.response_ids[0].tolist() == [0, 0, 0, PAD, PAD]  # right padded
    assert out.response_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert out.rollout_logprobs[0].tolist() == [-1, -1, -1, 0, 0]
    assert out.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert out.rewards.tolist() == [1, 0, 0, 1, 1, 1] and out.old_logprobs is None


def test_select_groups_keeps_whole_groups_renumbered():
    batch = _batch([[1.0, 1.0], [0.0, 1.0], [0.5, 0.0]])
    out = select_groups(batch, [2, 1])
    assert out.group_index.tolist() == [0, 0, 1, 1]
    assert out.response_ids[:, 0].tolist() == [20, 21, 10, 11]


def _rounds(rounds: list[list[list[float]]]):
    """next_prompts/rollout callables serving scripted rounds; records the prompts used."""
    served = []

    def next_prompts():
        served.append(len(served))
        return served[-1]

    def rollout(i):
        return _batch(rounds[i])

    return next_prompts, rollout, served


def test_sampler_fills_the_batch_and_never_returns_an_equal_reward_group():
    next_prompts, rollout, served = _rounds([
        [[1, 1], [0, 1], [0, 0]],   # round 1: one informative group
        [[1, 0], [1, 1], [0, 1]],   # round 2: two more; only one is needed
        [[0, 1], [0, 1], [0, 1]],   # never reached
    ])  # fmt: skip
    sampler = DynamicSampler(batch_size=2, max_rounds=5, pad_id=PAD)
    batch, m = sampler.collect(next_prompts, rollout)
    assert served == [0, 1]
    assert batch.group_index.tolist() == [0, 0, 1, 1]
    assert batch.response_ids[:, 0].tolist() == [10, 11, 0, 1]  # round 1 g1, round 2 g0
    for g in range(2):
        assert batch.rewards[batch.group_index == g].unique().numel() > 1
    assert m == {"dynamic_sampling/rounds": 2.0, "dynamic_sampling/groups_generated": 6.0,
                 "dynamic_sampling/groups_dropped": 3.0, "dynamic_sampling/groups_kept": 2.0,
                 "dynamic_sampling/filled": 1.0}  # fmt: skip


def test_sampler_stops_at_the_round_cap():
    next_prompts, rollout, served = _rounds([[[1, 1], [0, 1]], [[0, 0], [1, 1]]] + [[[1, 1]]] * 5)
    sampler = DynamicSampler(batch_size=4, max_rounds=2, pad_id=PAD)
    batch, m = sampler.collect(next_prompts, rollout)
    assert served == [0, 1] and m["dynamic_sampling/rounds"] == 2.0
    assert batch.size == 2 and m["dynamic_sampling/filled"] == 0.25
    # nothing informative within the cap: None, never a zero-variance group
    next_prompts, rollout, _ = _rounds([[[1, 1]], [[0, 0]]])
    none, m = DynamicSampler(2, 2, PAD).collect(next_prompts, rollout)
    assert none is None and m["dynamic_sampling/groups_kept"] == 0.0


def test_sampler_state_round_trips():
    next_prompts, rollout, _ = _rounds([[[1, 1], [0, 1]], [[0, 1]]])
    a = DynamicSampler(2, 3, PAD)
    a.collect(next_prompts, rollout)
    b = DynamicSampler(2, 3, PAD)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() == {
        "total_rounds": 2, "total_dropped": 1, "total_generated": 3}  # fmt: skip


def test_mask_truncated_zeroes_loss_and_invalidates():
    truncated = torch.tensor([False, True, False])
    loss_mask = torch.ones(3, 2)
    valid = torch.tensor([True, True, False])
    mask, ok = mask_truncated_samples(truncated, loss_mask, valid)
    assert mask.tolist() == [[1, 1], [0, 0], [1, 1]] and ok.tolist() == [True, False, False]
    assert loss_mask.sum() == 6  # inputs untouched
    # on a RolloutBatch (its loss_mask / valid fields are filled in __post_init__)
    batch = _batch([[1.0, 0.0]])
    batch.truncated = torch.tensor([True, False])
    out = mask_truncated(batch)
    assert out.loss_mask.tolist() == [[0, 0, 0], [1, 1, 1]] and out.valid.tolist() == [False, True]
    assert batch.valid.tolist() == [True, True]  # a copy: the input is untouched


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.max_sampling_rounds=0", "must be >= 1"),
        ("reward.overlong_buffer.length=16", "must be in [0, max_new_tokens=16)"),
        ("reward.overlong_buffer.penalty=-1", "must be >= 0"),
    ],
)
def test_config_validation(override, message):
    base = ["model.actor_model_name_or_path=x", "data.train_dataset=x",
            "trainer.max_new_tokens=16"]  # fmt: skip
    with pytest.raises(UserError) as err:
        load_config(None, [*base, override])
    assert message in str(err.value)
    with pytest.raises(UserError, match="a group of one"):
        load_config(None, [*base, "trainer.algorithm=ppo", "trainer.dynamic_sampling=true"])
