"""Dynamic sampling (DAPO / verl filter_groups): informative groups, selecting and joining
scored groups, and the rounds of ``sample_and_score`` (the plain loop in fit.py)."""

from __future__ import annotations

import pytest
import torch

from danka.config import load_config
from danka.errors import UserError
from danka.step.dynamic_sampling import (
    DynamicSampler,
    concat_batches,
    informative_groups,
    select_groups,
)
from danka.step.records import RewardStats, Rollout, Scored
from danka.step.train_step import PhaseClock, sample_and_score
from danka.types import RolloutBatch

PAD = 0


def _batch(group_sizes: list[int], prompt_len: int = 2, resp_len: int = 3) -> RolloutBatch:
    """Sample k of group g has response ids filled with 10g+k."""
    groups = [g for g, n in enumerate(group_sizes) for _ in range(n)]
    b = len(groups)
    ids = torch.tensor([[10 * g + k] * resp_len for g, n in enumerate(group_sizes)
                        for k in range(n)])  # fmt: skip
    return RolloutBatch(
        prompt_ids=torch.full((b, prompt_len), 7),
        prompt_mask=torch.ones(b, prompt_len, dtype=torch.long),
        response_ids=ids,
        response_mask=torch.ones(b, resp_len),
        group_index=torch.tensor(groups),
        truncated=torch.zeros(b, dtype=torch.bool),
    )


def _scored(group_rewards: list[list[float]], **kw) -> Scored:
    """One group per inner list, scored with those rewards."""
    batch = _batch([len(g) for g in group_rewards], **kw)
    rewards = torch.tensor([float(r) for g in group_rewards for r in g])
    texts = [f"c{i}" for i in range(batch.size)]
    stats = RewardStats(float(rewards.mean()), {}, 0.0, 0.0, 1.0, 3.0, 0.0, None)
    return Scored(
        rollout=Rollout(batch=batch, completions=texts, shown=texts),
        rewards=rewards,
        parts={"f": rewards.clone()},
        valid=torch.ones(batch.size, dtype=torch.bool),
        stats=stats,
    )


def test_informative_groups_need_two_valid_differing_rewards():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert informative_groups(rewards, groups).tolist() == [False, True, False]
    # with sample 2 invalid, group 1 has one valid sample left: not informative
    valid = torch.tensor([True, True, False, True, True, True])
    assert informative_groups(rewards, groups, valid).tolist() == [False, False, False]


def test_concat_pads_prompts_left_responses_right_and_renumbers_groups():
    a = _batch([2], prompt_len=2, resp_len=3)
    b = _batch([2, 2], prompt_len=4, resp_len=5)
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


def test_select_groups_keeps_whole_groups_renumbered():
    scored = _scored([[1.0, 1.0], [0.0, 1.0], [0.5, 0.0]])
    out = select_groups(scored, [2, 1])
    assert out.batch.group_index.tolist() == [0, 0, 1, 1]
    assert out.batch.response_ids[:, 0].tolist() == [20, 21, 10, 11]
    assert out.rewards.tolist() == [0.5, 0.0, 0.0, 1.0] and out.parts["f"].tolist() == [
        0.5, 0.0, 0.0, 1.0]  # fmt: skip
    assert out.rollout.completions == ["c4", "c5", "c2", "c3"]


class ScriptedStages:
    """The three stage methods ``sample_and_score`` calls, serving scripted rounds (each
    round's rewards per group); records which rounds were generated."""

    def __init__(self, rounds: list[list[list[float]]], sampler: DynamicSampler | None):
        self.rounds, self.dynamic, self.served = rounds, sampler, []

    def next_prompts(self) -> list[int]:
        self.served.append(len(self.served))
        return [self.served[-1]]

    def sample(self, prompt_idx: list[int], micro: int) -> int:
        return prompt_idx[0]

    def score(self, k: int) -> Scored:
        return _scored(self.rounds[k])


def test_rounds_fill_the_batch_and_never_keep_an_equal_reward_group():
    s = ScriptedStages([
        [[1, 1], [0, 1], [0, 0]],   # round 1: one informative group
        [[1, 0], [1, 1], [0, 1]],   # round 2: two more; only one is needed
        [[0, 1], [0, 1], [0, 1]],   # never reached
    ], DynamicSampler(batch_size=2, max_rounds=5, pad_id=PAD))  # fmt: skip
    kept, rounds, stats = sample_and_score(s, PhaseClock(), 4)
    assert s.served == [0, 1] and len(rounds) == 2
    assert kept.batch.group_index.tolist() == [0, 0, 1, 1]
    assert kept.batch.response_ids[:, 0].tolist() == [10, 11, 0, 1]  # round 1 g1, round 2 g0
    for g in range(2):
        assert kept.rewards[kept.batch.group_index == g].unique().numel() > 1
    # 6 groups generated, 3 informative (r1 g1; r2 g0, g2): 3 dropped, 2 kept of 2
    assert (stats.rounds, stats.groups_generated, stats.groups_dropped) == (2, 6, 3)
    assert (stats.groups_kept, stats.filled) == (2, 1.0)
    # the kept samples' stats are the mean over both rounds' rewards:
    # round 1 (1+1+0+1+0+0)/6 = 3/6, round 2 (1+0+1+1+0+1)/6 = 4/6 -> (3/6 + 4/6) / 2 = 7/12
    assert kept.stats.mean == pytest.approx(7 / 12)


def test_rounds_stop_at_the_cap():
    s = ScriptedStages([[[1, 1], [0, 1]], [[0, 0], [1, 1]]] + [[[1, 1]]] * 5,
                       DynamicSampler(batch_size=4, max_rounds=2, pad_id=PAD))  # fmt: skip
    kept, _, stats = sample_and_score(s, PhaseClock(), 4)
    assert s.served == [0, 1] and stats.rounds == 2
    assert kept.rollout.size == 2
    assert stats.filled == 0.25
    # nothing informative within the cap: None, never a zero-variance group
    s = ScriptedStages([[[1, 1]], [[0, 0]]], DynamicSampler(2, 2, PAD))
    none, rounds, stats = sample_and_score(s, PhaseClock(), 4)
    assert none is None and stats.groups_kept == 0 and len(rounds) == 2


def test_without_dynamic_sampling_one_round_is_the_step():
    s = ScriptedStages([[[1, 1]], [[0, 1]]], None)
    scored, rounds, stats = sample_and_score(s, PhaseClock(), 4)
    assert s.served == [0] and stats is None and scored.rewards.tolist() == [1, 1]


def test_sampler_state_round_trips():
    a = DynamicSampler(2, 3, PAD)
    sample_and_score(ScriptedStages([[[1, 1], [0, 1]], [[0, 1]]], a), PhaseClock(), 4)
    b = DynamicSampler(2, 3, PAD)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() == {
        "total_rounds": 2, "total_dropped": 1, "total_generated": 3}  # fmt: skip


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
