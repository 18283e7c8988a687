"""Rule rewards: verl's gsm8k semantics, math-verify equivalences, format/length/last_number."""

import pytest

from danka.rewards.builtin import (
    REWARDS,
    default_reward_for,
    extract_gsm8k_answer,
    gold_as_latex,
    gsm8k,
    register_reward,
)
from danka.types import PromptRow


def row(gt):
    return PromptRow(index=0, prompt="q", ground_truth=gt)


# ---- gsm8k (verl/utils/reward_score/gsm8k.py) -------------------------------------------


# Expected values are what verl's compute_score returns (verl/utils/reward_score/gsm8k.py,
# read 2026-11-30): strict = LAST "#### (-?[0-9.,]+)" in the last 300 chars, commas
# removed, then EXACT string equality with the ground truth.
@pytest.mark.parametrize(
    "text, gt, expected",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("#### 1,000", "1000", 1.0),  # comma stripped
        ("#### $18", "18", 0.0),  # verl: "$" is not in [0-9.,-] -> nothing extracted -> 0
        ("#### 18.", "18", 0.0),  # verl: extracts "18." != "18" -> format_score (0)
        ("#### 18.0", "18", 0.0),  # verl compares strings: "18.0" != "18"
        ("#### 5 then I fixed it #### 7", "7", 1.0),  # the LAST #### counts
        ("#### 5 then I fixed it #### 7", "5", 0.0),  # well-formed but wrong -> format_score 0
        ("#### -3", "-3", 1.0),  # negative numbers
        ("The answer is 7", "7", 0.0),  # no #### -> 0
        ("####7", "7", 0.0),  # verl needs the space after ####
        ("#### 7", " 7 ", 0.0),  # verl does not strip the ground truth
    ],
)
def test_gsm8k_strict_is_verls(text, gt, expected):
    assert gsm8k(text, row(gt)) == expected


def test_gsm8k_strict_format_score_on_verl_edge_cases():
    # "#### 18." is well-formed for verl's regex but not equal: format_score, not 0;
    # "#### $18" extracts nothing: 0 even with a format_score
    assert gsm8k("#### 18.", row("18"), format_score=0.1) == 0.1
    assert gsm8k("#### $18", row("18"), format_score=0.1) == 0.0
    assert extract_gsm8k_answer("#### 18.") == "18."
    assert extract_gsm8k_answer("#### $18") is None


def test_gsm8k_format_score_and_score():
    # wrong but well-formed -> format_score; correct -> score; no answer -> 0 regardless
    assert gsm8k("#### 71", row("72"), format_score=0.1) == 0.1
    assert gsm8k("#### 72", row("72"), format_score=0.1, score=2.0) == 2.0
    assert gsm8k("no answer here", row("72"), format_score=0.1) == 0.0


def test_gsm8k_clips_to_last_300_chars_like_verl():
    # the #### answer is followed by 400 chars, so verl's 300-char window misses it
    assert gsm8k("#### 7" + " and more" * 45, row("7")) == 0.0


@pytest.mark.parametrize(
    "text, gt, expected",
    [
        ("The answer is 7", "7", 1.0),  # last number, no #### needed
        ("3 apples, then 5, so 72", "72", 1.0),
        ("3 apples, then 5, so 72", "5", 0.0),  # last number is 72 -> format_score 0
        ("so -4", "-4", 1.0),
        ("no digits at all", "4", 0.0),  # nothing extracted -> 0
        ("The answer is 72.", "72", 0.0),  # verl: the run is "72." and "72." != "72"
        ("It costs 1,000", "1000", 0.0),  # verl's flexible keeps the comma: "1,000" != "1000"
    ],
)
def test_gsm8k_flexible_is_verls(text, gt, expected):
    assert gsm8k(text, row(gt), method="flexible") == expected


@pytest.mark.parametrize(
    "text, gt, expected",
    [
        ("The answer is 18.", "18", 1.0),  # last number, trailing "." dropped
        ("#### $18", "18", 1.0),
        ("#### 18.", "18", 1.0),
        ("#### 18.0", "18", 1.0),  # numerically equal
        ("#### 1,000", "1,000", 1.0),
        ("#### 5, then 7 more", "5", 1.0),  # a #### answer wins over later numbers
        ("no number", "5", 0.0),
    ],
)
def test_gsm8k_lenient_is_a_separate_option(text, gt, expected):
    assert gsm8k(text, row(gt), method="lenient") == expected


@pytest.mark.parametrize(
    "text, gt, expected",
    [
        ("48 + 24 = 72\n\\[ \\boxed{72} \\]", "72", 1.0),  # Qwen's way
        ("\\boxed{1,200}", "1200", 1.0),  # comma dropped
        ("\\boxed{\\$18.00}", "18", 1.0),  # dollar sign dropped, numeric comparison
        ("\\boxed{18 \\text{ apples}}", "18", 1.0),  # a unit in \\text{} dropped
        ("\\boxed{5} ... \\boxed{7}", "7", 1.0),  # the LAST box counts
        ("\\boxed{5} ... \\boxed{7}", "5", 0.0),
        ("#### 7", "7", 0.0),  # no box: nothing extracted
        ("\\boxed{7", "7", 0.0),  # cut inside the box
        ("\\boxed{}", "7", 0.0),  # an empty box
    ],
)
def test_gsm8k_boxed_grades_the_last_box(text, gt, expected):
    assert gsm8k(text, row(gt), method="boxed") == expected


def test_gsm8k_leniency_is_off_by_default():
    # issue 11's examples: none of them is credited by the default (strict) or by flexible
    for text in ("The answer is 18.", "#### $18", "#### 18."):
        assert gsm8k(text, row("18")) == 0.0
    assert gsm8k("The answer is 18.", row("18"), method="flexible") == 0.0


def test_extract_gsm8k_answer_mirrors_verl():
    assert extract_gsm8k_answer("#### 1,234.5") == "1234.5"
    assert extract_gsm8k_answer("nothing") is None
    # flexible keeps commas (verl does not clean them) and skips a lone "."
    assert extract_gsm8k_answer("1,000 .", method="flexible") == "1,000"
    # verl quirk: when every run is invalid it keeps the first one, which then scores format_score
    assert extract_gsm8k_answer("Hello.", method="flexible") == "."
    assert gsm8k("Hello.", row("3"), method="flexible", format_score=0.25) == 0.25
    with pytest.raises(ValueError):
        extract_gsm8k_answer("#### 1", method="loose")


# ---- math (math-verify) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gt, expected",
    [
        ("So the result is \\boxed{0.5}.", "\\frac{1}{2}", 1.0),
        ("The probability is 0.5", "\\frac{1}{2}", 1.0),  # no box: last number
        ("\\boxed{\\frac{2}{4}}", "0.5", 1.0),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
        ("first \\boxed{3} then \\boxed{4}", "4", 1.0),  # the LAST box
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),  # symbolic equality
        ("I cannot solve this.", "4", 0.0),
        ("\\boxed{4}", "$4$", 1.0),  # gold already in $...$
    ],
)
def test_math_verify(completion, gt, expected):
    assert REWARDS["math"](completion, row(gt)) == expected


# MATH golds as they appear in the dataset (hendrycks MATH / lighteval's solutions'
# \boxed{} contents): dollar amounts with an escaped \$, golds in $...$, boxed golds.
# math-verify parses none of the \$ ones unwrapped, so before the fix every sample scored 0.
@pytest.mark.parametrize(
    "completion, gt",
    [
        ("She pays \\boxed{\\$18.90} in total.", "\\$18.90"),
        ("She pays \\boxed{18.90} in total.", "\\$18.90"),
        ("So she pays 18.90 dollars", "\\$18.90"),  # no box: the last number
        ("\\boxed{\\$1.50}", "\\$ 1.50"),
        ("\\boxed{32000}", "\\$32{,}000"),
        ("\\boxed{\\frac{1}{2}}", "\\$\\frac{1}{2}"),
        ("\\boxed{4}", "$4$"),
        ("\\boxed{\\frac{3}{4}}", "$\\frac{3}{4}$"),
        ("\\boxed{5}", "\\boxed{5}"),  # an already boxed gold
        ("\\boxed{10\\%}", "10\\%"),
    ],
)
def test_math_golds_with_dollars_and_boxes(completion, gt):
    assert REWARDS["math"](completion, row(gt)) == 1.0
    assert REWARDS["math"]("\\boxed{7.25}", row(gt)) == 0.0  # and wrong answers still 0


def test_gold_as_latex():
    assert gold_as_latex("\\$18.90") == "\\boxed{\\$18.90}"
    assert gold_as_latex("$4$") == "\\boxed{4}"
    assert gold_as_latex("$$x^2$$") == "\\boxed{x^2}"
    assert gold_as_latex("\\(x\\)") == "\\boxed{x}"
    assert gold_as_latex("\\boxed{5}") == "\\boxed{5}"
    assert gold_as_latex("$5\\$") == "\\boxed{$5\\$}"  # the last $ is escaped: kept


def test_math_without_ground_truth_is_zero():
    assert REWARDS["math"]("\\boxed{1}", row(None)) == 0.0


# ---- format, length, last_number -----------------------------------------------------------


def test_format():
    fmt = REWARDS["format"]
    assert fmt("reasoning...\n#### 42", row("42")) == 1.0
    assert fmt("#### -1,234.5  \n", row("x")) == 1.0
    assert fmt("#### 42 and then more text", row("42")) == 0.0
    assert fmt("<answer>7</answer>", row("7"), pattern=r"<answer>\d+</answer>") == 1.0


def test_length():
    length = REWARDS["length"]
    # target_chars=10: -min(1, |L-10|/10)
    assert length("x" * 5, row(None), target_chars=10) == -0.5  # |5-10|/10
    assert length("x" * 10, row(None), target_chars=10) == 0.0
    assert length("x" * 30, row(None), target_chars=10) == -1.0  # 20/10 clipped to 1
    # max_chars=10: -min(1, max(0, L-10)/10)
    assert length("x" * 5, row(None), max_chars=10) == 0.0
    assert length("x" * 13, row(None), max_chars=10) == pytest.approx(-0.3)  # 3/10
    with pytest.raises(ValueError):
        length("x", row(None))
    with pytest.raises(ValueError):
        length("x", row(None), target_chars=3, max_chars=4)


def test_last_number():
    ln = REWARDS["last_number"]
    assert ln("12 + 1 = 13", row("13")) == 1.0
    assert ln("12 + 1 = 13", row("12")) == 0.0
    assert ln("1,234", row("1234")) == 1.0
    assert ln("no number", row("1")) == 0.0
    assert ln(" 13 ", row("13"), only_number_bonus=0.5) == 1.5  # just the number: bonus
    assert ln("it is 13", row("13"), only_number_bonus=0.5) == 1.0  # words too: no bonus


def test_registry_refuses_duplicates():
    assert {"gsm8k", "math", "format", "length", "last_number"} <= set(REWARDS)
    with pytest.raises(ValueError, match="already registered"):
        register_reward("gsm8k")(lambda c, r: 0.0)


def test_default_reward_for():
    assert default_reward_for("openai/gsm8k") == "gsm8k"
    assert default_reward_for("lighteval/MATH") == "math"
    assert default_reward_for("DigitalLearningGmbH/MATH-lighteval") == "math"
    assert default_reward_for("math") == "math"
    assert default_reward_for("my/own_data") is None
