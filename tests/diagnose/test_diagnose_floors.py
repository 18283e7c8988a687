"""Guess floors, scored by danka's own reward computer (hand-checked)."""

import importlib.util
from pathlib import Path

import pytest

from danka.diagnose.floors import guess_answers, guess_floors
from danka.rewards.combine import RewardSpec, build_reward_computer
from danka.types import PromptRow

# ground truths 5, 5, 17, 6, 9: the most common answer is "5" (right for 2 of 5 = 40%);
# the prompts' last numbers are 3, 4, 7, 3, 9: right only for the last row (1 of 5 = 20%);
# the empty answer is right for none
ROWS = [
    PromptRow(0, "What is 2 + 3?", "5"),
    PromptRow(1, "What is 1 + 4?", "5"),
    PromptRow(2, "What is 10 + 7?", "17"),
    PromptRow(3, "What is 3 + 3?", "6"),
    PromptRow(4, [{"role": "user", "content": "Tom has 9 apples. How many? Hint: 9"}], "9"),
]
PROMPTS = ["p"] * len(ROWS)


def _rewards(*specs: RewardSpec):
    return build_reward_computer(list(specs), base_dir=Path.cwd())


def test_guess_answers_per_row():
    g = guess_answers(ROWS)
    assert g["common_answer"] == ["5"] * 5
    assert g["last_prompt_number"] == ["3", "4", "7", "3", "9"]  # chat rows: the user turn
    assert g["empty"] == [""] * 5


def test_floors_of_gsm8k_strict_flexible_and_format():
    with _rewards(RewardSpec("gsm8k", 1.0, {"method": "strict"}),
                  RewardSpec("gsm8k", 0.5, {"method": "flexible"}),
                  RewardSpec("format", 0.1)) as rewards:  # fmt: skip
        floors = guess_floors(ROWS, PROMPTS, rewards)
    # strict reads "#### 5", flexible the last number: both 2/5 for "5", 1/5 for the
    # prompt's last number, 0 for "", so the floor is 40%
    assert floors.accuracy["gsm8k"] == {"common_answer": 0.4, "last_prompt_number": 0.2,
                                        "empty": 0.0}  # fmt: skip
    assert floors.accuracy["gsm8k_2"] == floors.accuracy["gsm8k"]
    assert floors.primary == "gsm8k" and floors.guess_floor == pytest.approx(0.4)
    assert floors.common_answer == "5" and floors.best["gsm8k"] == "common_answer"
    # "#### 5" always has the format: format scores 1.0 for a right and a wrong number
    # alike, so it does not score correctness
    assert floors.accuracy["format"]["common_answer"] == 1.0
    assert floors.correctness == ("gsm8k", "gsm8k_2")
    m = floors.metrics()
    assert m["eval/guess_floor"] == pytest.approx(0.4)
    assert m["eval/guess_floor/gsm8k_2"] == pytest.approx(0.4)
    assert m["eval/guess/last_prompt_number/gsm8k"] == pytest.approx(0.2)
    assert not any("format" in k for k in m)
    assert floors.to_json()["best_guess"] == {"gsm8k": "common_answer",
                                              "gsm8k_2": "common_answer"}  # fmt: skip


def test_floor_of_last_number_and_a_bonus_above_one():
    # last_number with only_number_bonus 0.1: the bare "5" scores 1.1 >= 1.0, still right
    with _rewards(RewardSpec("last_number", 1.0, {"only_number_bonus": 0.1})) as rewards:
        floors = guess_floors(ROWS, PROMPTS, rewards)
    assert floors.accuracy["last_number"]["common_answer"] == pytest.approx(0.4)
    assert floors.correctness == ("last_number",)


@pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="math-verify")
def test_floor_of_the_math_reward_reads_boxed_or_the_last_number():
    with _rewards(RewardSpec("math")) as rewards:
        floors = guess_floors(ROWS, PROMPTS, rewards)
    assert floors.accuracy["math"]["common_answer"] == pytest.approx(0.4)
    assert floors.correctness == ("math",)


def test_no_rows():
    with _rewards(RewardSpec("gsm8k")) as rewards:
        floors = guess_floors([], [], rewards)
    assert floors.guess_floor == 0.0 and floors.metrics() == {"eval/guess_floor": 0.0}
