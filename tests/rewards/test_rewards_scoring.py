"""The one "correct" rule (danka/rewards/scoring.py), shared by danka eval and training."""

import pytest
import torch

from danka.rewards.combine import RewardOutput
from danka.rewards.scoring import judge, score_samples


def test_judge_is_the_one_correct_rule():
    out = RewardOutput(
        scores=torch.tensor([1.5, 0.2, 1.0]),
        per_function={"strict": torch.tensor([1.0, 0.0, 0.999999]), "flex": torch.ones(3)},
        valid=torch.ones(3, dtype=torch.bool),
        num_errors=0,
    )
    correct, per_fn = judge(out)
    # the first function decides, with 1e-6 slack: 1.0 yes, 0.0 no, 0.999999 yes
    assert correct.tolist() == [True, False, True]
    assert per_fn == {"strict": pytest.approx(2 / 3), "flex": 1.0}


class _Rewards:
    """Scores a completion by its number: "1" is right (1.0), anything else 0.5."""

    def __call__(self, rows, prompts, completions):
        scores = torch.tensor([1.0 if c == "1" else 0.5 for c in completions])
        return RewardOutput(scores=scores, per_function={"rule": scores},
                            valid=torch.ones(len(completions), dtype=torch.bool), num_errors=0)  # fmt: skip


def test_score_samples_groups_answers_by_row():
    scores, correct, per_fn = score_samples(
        ["r0", "r1"], ["p0", "p1"], [["1", "0"], ["0"]], _Rewards()
    )
    assert scores == [[1.0, 0.5], [0.5]]
    assert correct == [[True, False], [False]]
    assert per_fn == {"rule": pytest.approx(1 / 3)}
