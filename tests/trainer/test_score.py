"""Step 3 (``steps.score``) without a model: per-function means over the samples a function
applies to, the not-applicable fraction, DAPO's overlong penalty added to the reward, and
``trainer.mask_truncated`` switching truncated samples off."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from danka.rewards.combine import RewardOutput
from danka.trainer import steps
from danka.types import RolloutBatch


def _run(output: RewardOutput, *, length: int = 0, mask_truncated: bool = False):
    """The parts of a Run that ``score`` reads: 2 prompts x 2 samples, max_new_tokens 8."""
    cfg = SimpleNamespace(
        trainer=SimpleNamespace(
            max_new_tokens=8, samples_per_prompt=2, mask_truncated=mask_truncated
        ),
        reward=SimpleNamespace(overlong_buffer=SimpleNamespace(length=length, penalty=1.0)),
    )
    train = SimpleNamespace(rows=["r0", "r1"], texts=["p0", "p1"])
    rewards = lambda rows, texts, completions: output  # noqa: E731
    return SimpleNamespace(cfg=cfg, train=train, rewards=rewards, agent=None)


def _batch() -> RolloutBatch:
    """4 samples with response lengths 2, 6, 7, 8 (the last one truncated)."""
    mask = torch.tensor([[1.0] * n + [0.0] * (8 - n) for n in (2, 6, 7, 8)])
    return RolloutBatch(
        prompt_ids=torch.zeros(4, 1, dtype=torch.long),
        prompt_mask=torch.ones(4, 1, dtype=torch.long),
        response_ids=torch.zeros(4, 8, dtype=torch.long),
        response_mask=mask,
        group_index=torch.tensor([0, 0, 1, 1]),
        truncated=torch.tensor([False, False, False, True]),
    )


def _output(valid=(True, True, True, True)) -> RewardOutput:
    return RewardOutput(
        scores=torch.tensor([1.0, 0.0, 2.0, 4.0]),
        per_function={"a": torch.tensor([1.0, 0.0, 2.0, 4.0]), "b": torch.zeros(4)},
        valid=torch.tensor(valid),
        num_errors=1,
        num_calls=8,  # 4 samples x 2 functions
        applicable={"a": torch.tensor([True, False, True, True]), "b": torch.zeros(4).bool()},
        num_not_applicable=1,
    )


def test_reward_means_are_over_the_valid_samples_a_function_applies_to():
    batch = _batch()
    m = steps.score(_run(_output(valid=(True, True, True, False))), batch, ["x"] * 4)
    # "a" applies to samples 0, 2, 3; sample 3 is invalid: mean(1, 2) = 1.5 (not (1+0+2)/3)
    assert m["reward/a"] == 1.5
    assert m["reward/b"] == 0.0  # applies nowhere
    assert m["reward/not_applicable"] == 1 / 4  # one sample of four had no function
    assert m["reward/error_rate"] == 1 / 8  # per (function, sample) call
    # combined reward over the valid samples 0..2: (1 + 0 + 2) / 3 = 1.0; invalid -> 0
    assert m["reward"] == 1.0 and batch.rewards.tolist() == [1.0, 0.0, 2.0, 0.0]
    assert batch.valid.tolist() == [True, True, True, False]


def test_overlong_penalty_is_added_and_logged_as_a_part():
    batch = _batch()
    m = steps.score(_run(_output(), length=4), batch, ["x"] * 4)
    # expected = 8 - 4 = 4; lengths 2, 6, 7, 8 -> -(0, 2, 3, 4)/4 * 1.0 = 0, -0.5, -0.75, -1
    assert batch.reward_parts["overlong"].tolist() == [0.0, -0.5, -0.75, -1.0]
    assert batch.rewards.tolist() == [1.0, -0.5, 1.25, 3.0]
    assert m["reward/overlong"] == (0 - 0.5 - 0.75 - 1.0) / 4


def test_mask_truncated_makes_truncated_samples_invalid_with_no_loss():
    batch = _batch()
    steps.score(_run(_output(), mask_truncated=True), batch, ["x"] * 4)
    assert batch.valid.tolist() == [True, True, True, False]
    assert batch.loss_mask[3].sum() == 0 and batch.train_mask[3].sum() == 0
    assert batch.loss_mask[2].sum() == 7  # the others keep their tokens
    off = _batch()
    steps.score(_run(_output()), off, ["x"] * 4)
    assert off.valid.all() and off.loss_mask[3].sum() == 8


def test_weight_zero_rule_reward_is_logged_next_to_a_reward_model_but_not_trained_on(tmp_path):
    """An RL run on a reward model with the rule reward as a pure metric: config
    ``reward.functions: [{name: gsm8k, weight: 0}]`` + ``model.reward_model_name_or_path``."""
    from danka.rewards.combine import RewardSpec, build_reward_computer
    from danka.types import PromptRow

    rm_scores = [0.5, -1.0, 2.0, 0.25]  # what the reward model says about the 4 samples
    rows = [PromptRow(index=i, prompt=f"q{i}", ground_truth="7") for i in (0, 1)]
    computer = build_reward_computer(
        [RewardSpec("gsm8k", weight=0.0)],
        base_dir=tmp_path,
        reward_model=lambda prompts, completions: rm_scores,
    )
    run = _run(None)  # its reward output is replaced by the real computer below
    run.train = SimpleNamespace(rows=rows, texts=["p0", "p1"])
    run.rewards = lambda rows, texts, completions: computer(rows, texts, completions)
    batch = _batch()
    batch.prompt_index = torch.tensor([0, 0, 1, 1])
    m = steps.score(run, batch, ["#### 7", "#### 8", "#### 7", "no answer"])
    # trained on: the reward model alone, 0 * gsm8k + 1 * rm = [0.5, -1, 2, 0.25]
    assert batch.rewards.tolist() == rm_scores
    assert m["reward"] == (0.5 - 1.0 + 2.0 + 0.25) / 4  # 0.4375
    # logged: the rule reward (correct, wrong, correct, no answer) = [1, 0, 1, 0] -> mean 0.5
    assert batch.reward_parts["gsm8k"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert m["reward/gsm8k"] == 0.5
    assert m["reward/reward_model"] == 0.4375
