"""Step 3 (``danka.step.score.score``) without a model: per-function means over the
samples a function applies to, the not-applicable fraction, DAPO's overlong penalty added
to the reward, and ``trainer.mask_truncated`` switching truncated samples off (by validity,
never by zeroing a mask)."""

from __future__ import annotations

import torch

from danka.rewards.combine import RewardOutput
from danka.step.prompt_set import PromptSet
from danka.step.records import Rollout
from danka.step.score import ScoreSettings, score
from danka.types import PromptRow, RolloutBatch

PROMPTS = PromptSet(
    rows=[PromptRow(index=i, prompt=f"q{i}", ground_truth="7") for i in (0, 1)],
    texts=["p0", "p1"],
    ids=[[1], [2]],
)


def _settings(length: int = 0, mask_truncated: bool = False) -> ScoreSettings:
    """2 prompts x 2 samples, max_new_tokens 8."""
    return ScoreSettings(
        samples_per_prompt=2,
        response_budget=8,
        overlong_length=length,
        overlong_penalty=1.0,
        mask_truncated=mask_truncated,
    )


def _rollout(completions=("x", "x", "x", "x")) -> Rollout:
    """4 samples with response lengths 2, 6, 7, 8 (the last one truncated)."""
    mask = torch.tensor([[1.0] * n + [0.0] * (8 - n) for n in (2, 6, 7, 8)])
    batch = RolloutBatch(
        prompt_ids=torch.zeros(4, 1, dtype=torch.long),
        prompt_mask=torch.ones(4, 1, dtype=torch.long),
        response_ids=torch.zeros(4, 8, dtype=torch.long),
        response_mask=mask,
        group_index=torch.tensor([0, 0, 1, 1]),
        truncated=torch.tensor([False, False, False, True]),
    )
    return Rollout(batch=batch, completions=list(completions), shown=list(completions))


def _fixed(output: RewardOutput):
    return lambda rows, texts, completions: output


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
    out = score(_fixed(_output(valid=(True, True, True, False))), PROMPTS, _rollout(), _settings())
    m = out.stats
    # "a" applies to samples 0, 2, 3; sample 3 is invalid: mean(1, 2) = 1.5 (not (1+0+2)/3)
    assert m.per_part["a"] == 1.5
    assert m.per_part["b"] == 0.0  # applies nowhere
    assert m.not_applicable == 1 / 4  # one sample of four had no function
    assert m.error_rate == 1 / 8  # per (function, sample) call
    # combined reward over the valid samples 0..2: (1 + 0 + 2) / 3 = 1.0; invalid -> 0
    assert m.mean == 1.0 and out.rewards.tolist() == [1.0, 0.0, 2.0, 0.0]
    assert out.valid.tolist() == [True, True, True, False]
    # groups (1, 0): rewards differ; (2, invalid): one valid sample, advantage 0 -> 1 of 2
    assert m.zero_adv_groups == 0.5


def test_overlong_penalty_is_added_and_logged_as_a_part():
    out = score(_fixed(_output()), PROMPTS, _rollout(), _settings(length=4))
    # expected = 8 - 4 = 4; lengths 2, 6, 7, 8 -> -(0, 2, 3, 4)/4 * 1.0 = 0, -0.5, -0.75, -1
    assert out.parts["overlong"].tolist() == [0.0, -0.5, -0.75, -1.0]
    assert out.rewards.tolist() == [1.0, -0.5, 1.25, 3.0]
    assert out.stats.per_part["overlong"] == (0 - 0.5 - 0.75 - 1.0) / 4


def test_mask_truncated_makes_truncated_samples_invalid_without_zeroing_a_mask():
    out = score(_fixed(_output()), PROMPTS, _rollout(), _settings(mask_truncated=True))
    assert out.valid.tolist() == [True, True, True, False]
    assert out.train_mask[3].sum() == 0  # no loss on the truncated sample ...
    assert out.batch.loss_mask[3].sum() == 8  # ... its mask untouched (validity says it)
    assert out.train_mask[2].sum() == 7  # the others keep their tokens
    off = score(_fixed(_output()), PROMPTS, _rollout(), _settings())
    assert off.valid.all() and off.train_mask[3].sum() == 8


def test_weight_zero_rule_reward_is_logged_next_to_a_reward_model_but_not_trained_on(tmp_path):
    """An RL run on a reward model with the rule reward as a pure metric: config
    ``reward.functions: [{name: gsm8k, weight: 0}]`` + ``model.reward_model_name_or_path``."""
    from danka.rewards.combine import RewardSpec, build_reward_computer

    rm_scores = [0.5, -1.0, 2.0, 0.25]  # what the reward model says about the 4 samples
    computer = build_reward_computer(
        [RewardSpec("gsm8k", weight=0.0)],
        base_dir=tmp_path,
        reward_model=lambda prompts, completions: rm_scores,
    )
    rollout = _rollout(["#### 7", "#### 8", "#### 7", "no answer"])
    rollout.batch.prompt_index = torch.tensor([0, 0, 1, 1])
    out = score(computer, PROMPTS, rollout, _settings())
    # trained on: the reward model alone, 0 * gsm8k + 1 * rm = [0.5, -1, 2, 0.25]
    assert out.rewards.tolist() == rm_scores
    assert out.stats.mean == (0.5 - 1.0 + 2.0 + 0.25) / 4  # 0.4375
    # logged: the rule reward (correct, wrong, correct, no answer) = [1, 0, 1, 0] -> mean 0.5
    assert out.parts["gsm8k"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out.stats.per_part["gsm8k"] == 0.5
    assert out.stats.per_part["reward_model"] == 0.4375


def test_equal_reward_groups_counts_the_groups_whose_advantage_is_zero():
    from danka.step.score import equal_reward_groups

    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5 + 1e-7, 2.0, 3.0])
    # groups of 2: (1, 1) equal, (0, 1) not, (0.5, 0.5 + 1e-7) equal within the estimators'
    # 1e-6, (2, 3) not -> 2 of 4
    assert equal_reward_groups(r, 2) == 0.5
    # invalid samples are left out, as the estimators leave them out: (0, -) has one valid
    # sample, (-, -) none: both get advantage 0 -> 4 of 4
    valid = torch.tensor([True, True, True, False, True, True, False, False])
    assert equal_reward_groups(r, 2, valid) == 1.0
    assert equal_reward_groups(r, 1) is None  # groups of one: nothing to compare


GROWING_REWARD = """
calls = 0


def reward(prompts, completions, **columns):
    global calls
    calls += 1  # 1: the start-up check, 2: step 1, 3: step 2
    return [1e10 if calls >= 3 else 1.0 for _ in completions]
"""


def test_a_combined_reward_past_float32_stops_the_run_keeping_the_steps_before(
    tmp_path, tiny_model_dir, capsys
):
    """weight 1e30 x score 1e10 is inf in float32: exit 2 at step 2 naming the weight, not
    a "loss is nan" step logged with reward inf; step 1's metrics and checkpoint stay."""
    from tests.trainer.conftest import make_config, train_cli

    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        trainer={"total_steps": 3, "save_steps": 1},
        reward={"functions": [{"name": "reward.py:reward", "weight": 1e30}]},
    )
    (tmp_path / "reward.py").write_text(GROWING_REWARD)
    out = tmp_path / "out"
    assert train_cli(cfg, out) == 2
    err = capsys.readouterr().err
    assert "reward.functions[0].weight" in err and "reward: 1e+30 x 1e+10" in err
    assert "Traceback" not in err
    steps = [line for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    assert len(steps) == 1 and '"step": 1' in steps[0]
    assert (out / "actor" / "checkpoint_1").is_dir()
    assert "reward.functions[0].weight" in (out / "logs" / "train.log").read_text()


def test_an_environment_reward_that_is_not_finite_stops_the_step():
    """The combined reward checks the weighted sum (danka.rewards.combine); the parts
    added here (an environment's step rewards, the overlong penalty) are checked too."""
    import pytest

    from danka.errors import UserError

    rollout = _rollout()
    rollout.env_rewards = torch.tensor([0.0, float("inf"), 0.0, 0.0])
    with pytest.raises(UserError) as err:
        score(_fixed(_output()), PROMPTS, rollout, _settings())
    assert err.value.where == "agent.environment" and "sample 1 (data row 0)" in str(err.value)
    assert "env: inf" in str(err.value)
