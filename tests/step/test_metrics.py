"""The metrics builder (danka/step/metrics.py): the one place typed step results become
the logged dict, with the names docs/metrics.md lists; the loop's own signals are fields."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from danka.step.metrics import step_metrics, update_metrics
from danka.step.records import (
    ON_POLICY,
    ActorStats,
    CriticStats,
    OldAndRef,
    Prepared,
    RewardStats,
    Rollout,
    Scored,
    StepResult,
    TrainBatch,
    UpdateStats,
)
from danka.types import RolloutBatch


def _scored(reward: float) -> Scored:
    batch = RolloutBatch(
        prompt_ids=torch.ones(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=torch.ones(2, 3, dtype=torch.long),
        response_mask=torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),  # 4 tokens
        group_index=torch.tensor([0, 0]),
        truncated=torch.tensor([False, False]),
    )
    stats = RewardStats(reward, {"f": reward}, 0.0, 0.0, 1.0, 2.0, 0.0, 0.5)
    rollout = Rollout(batch=batch, completions=["a", "b"], shown=["a", "b"])
    return Scored(rollout, torch.tensor([reward, 0.0]), {}, torch.tensor([True, True]), stats)


def _prepared(scored: Scored, gap: float | None = None) -> Prepared:
    train = TrainBatch.of(
        scored.batch, valid=scored.valid, advantages=torch.zeros(2, 3), old_logprobs=ON_POLICY
    )
    logp = OldAndRef(ON_POLICY, None, None, scored.valid, gap, {"rollout_is/mean": 0.9})
    return Prepared(train, logp, kl_in_reward=None)


def _result(update: UpdateStats | None, rounds=(1.0,), kl=None) -> StepResult:
    scored = _scored(rounds[-1])
    return StepResult(
        scored=scored,
        rounds=[_scored(r).stats for r in rounds],
        prepared=_prepared(scored) if update is not None else None,
        update=update,
        dynamic=None,
        seconds={"rollout": 2.0, "update": 1.0, "step": 3.5},
        peaks_gib={},
        micro=4,
        kl_measured=kl,
    )


ACTOR = ActorStats(
    loss=0.5, pg_loss=0.4, entropy=1.5, grad_norm=2.0, kl_loss=0.1, kl_token_mean=0.05,
    logprob_gap=None, policy={"clipfrac": 0.25},
)  # fmt: skip


def test_the_logged_names_and_values():
    m = step_metrics(_result(UpdateStats(ACTOR, None), kl=0.05), lr=1e-5, kl_coef=0.2,
                     packing_ratio=0.8)  # fmt: skip
    assert m["loss"] == 0.5 and m["actor/pg_loss"] == 0.4 and m["actor/clipfrac"] == 0.25
    assert m["actor/kl_token_mean"] == 0.05 and m["kl"] == 0.05 and m["kl_coef"] == 0.2
    assert m["reward"] == 1.0 and m["reward/f"] == 1.0 and m["reward/zero_adv_groups"] == 0.5
    assert m["skipped_step"] == 0.0 and m["rollout_is/mean"] == 0.9
    assert m["time/rollout"] == 2.0 and m["time/step"] == 3.5 and m["lr"] == 1e-5
    # 4 generated tokens in 2 s of rollout
    assert m["throughput/gen_tokens_per_s"] == pytest.approx(2.0)


def test_a_part_named_like_a_metric_of_danka_never_overwrites_it():
    """reward/error_rate, reward/zero_adv_groups... are danka's numbers whatever the parts
    are called (labels are refused at start-up; this is the builder's own guarantee)."""
    result = _result(UpdateStats(ACTOR, None))
    stats = dataclasses.replace(result.rounds[0], per_part={"error_rate": 1.0, "valid_frac": 7.0})
    m = step_metrics(dataclasses.replace(result, rounds=[stats]), lr=0.0, kl_coef=0.0,
                     packing_ratio=1.0)  # fmt: skip
    assert m["reward/error_rate"] == 0.0 and m["reward/valid_frac"] == 1.0


def test_reward_stats_are_averaged_over_sampling_rounds():
    m = step_metrics(_result(UpdateStats(ACTOR, None), rounds=(1.0, 0.0)), lr=0.0, kl_coef=0.0,
                     packing_ratio=1.0)  # fmt: skip
    assert m["reward"] == 0.5 and m["reward/f"] == 0.5  # (1 + 0) / 2


def test_a_skipped_step_has_no_loss_and_the_critic_loss_stands_in_during_warmup():
    skipped = _result(UpdateStats(None, None, skipped=True, reason="policy loss is nan"))
    assert not skipped.finite and math.isnan(skipped.loss)
    assert step_metrics(skipped, lr=0, kl_coef=0, packing_ratio=1)["skipped_step"] == 1.0
    warmup = _result(UpdateStats(None, CriticStats(0.7, 1.0, {"vf_clipfrac": 0.1})))
    assert warmup.finite and warmup.loss == 0.7
    means, shares = update_metrics(warmup.update)
    assert shares == {"critic/vf_loss": 0.7}  # a global share: summed over ranks
    assert means["critic/vf_clipfrac"] == 0.1 and "actor/loss" not in means


def test_nothing_to_train_on_is_not_a_fault():
    r = _result(None)
    assert r.finite and not r.trained
    m = step_metrics(r, lr=0, kl_coef=0, packing_ratio=1)
    assert m["dynamic_sampling/skipped_update"] == 1.0 and math.isnan(m["loss"])


def test_shares_are_the_values_normalised_by_global_counts():
    means, shares = update_metrics(UpdateStats(ACTOR, None))
    assert set(shares) == {"actor/loss", "actor/pg_loss", "actor/entropy", "actor/kl_loss",
                           "actor/kl_token_mean"}  # fmt: skip
    assert "actor/grad_norm" in means and "actor/clipfrac" in means
