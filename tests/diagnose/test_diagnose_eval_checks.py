"""Checks on held-out evaluations and saved completions."""

from danka.diagnose import RunRecord, diagnose
from danka.diagnose.checks_eval import (
    accuracy_dropped,
    below_guess_floor,
    constant_answers,
    final_answer,
    probe_drift,
)


def _evals(*points: dict) -> list[dict]:
    return [{"eval/n": 200.0, **p} for p in points]


def test_below_guess_floor_after_training():
    # the GSM8K GRPO run: 0.3% -> 2.3%, floor 3.0% (always "#### 5"): at or below
    run = RunRecord(evals=_evals(
        {"step": 0, "eval/accuracy": 0.003, "eval/guess_floor": 0.0303},
        {"step": 73, "eval/accuracy": 0.023},
    ))  # fmt: skip
    f = below_guess_floor(run, 1)
    assert f.step == 73 and "2.3%" in f.evidence and "3.0%" in f.evidence
    above = RunRecord(evals=_evals({"step": 0, "eval/accuracy": 0.2, "eval/guess_floor": 0.03},
                                   {"step": 10, "eval/accuracy": 0.6}))  # fmt: skip
    assert below_guess_floor(above, 1) is None
    assert below_guess_floor(RunRecord(evals=run.evals[:1]), 0) is None  # step 0 only
    no_floor = RunRecord(evals=_evals({"step": 0, "eval/accuracy": 0.0},
                                      {"step": 5, "eval/accuracy": 0.0}))  # fmt: skip
    assert below_guess_floor(no_floor, 1) is None


def test_accuracy_drop_beyond_two_standard_errors():
    # 0.5 -> 0.4 on 200: se = sqrt((0.25 + 0.24) / 200) = 0.0495, 2 se = 0.099 < 0.1
    run = RunRecord(evals=_evals({"step": 0, "eval/accuracy": 0.5},
                                 {"step": 9, "eval/accuracy": 0.4}))  # fmt: skip
    assert accuracy_dropped(run, 1).step == 9
    # 0.5 -> 0.42: se = sqrt((0.25 + 0.2436) / 200) = 0.0497, 0.08 < 0.0994: noise
    noise = RunRecord(evals=_evals({"step": 0, "eval/accuracy": 0.5},
                                   {"step": 9, "eval/accuracy": 0.42}))  # fmt: skip
    assert accuracy_dropped(noise, 1) is None


def test_final_checks_judge_only_the_last_evaluation():
    # the middle evaluation is below the floor, the last is not: nothing after training
    run = RunRecord(evals=_evals(
        {"step": 0, "eval/accuracy": 0.2, "eval/guess_floor": 0.05},
        {"step": 5, "eval/accuracy": 0.04},
        {"step": 10, "eval/accuracy": 0.5},
    ))  # fmt: skip
    assert {f.id for f in diagnose(run)} == set()


def test_probe_drift_on_general_prompts():
    # degenerate 0/8 -> 6/8 = +0.75 >= 0.5
    run = RunRecord(evals=_evals(
        {"step": 0, "probe/degenerate_frac": 0.0, "probe/mean_length": 40.0},
        {"step": 20, "probe/degenerate_frac": 0.75, "probe/mean_length": 30.0, "probe/kl": 2.5},
    ))  # fmt: skip
    f = probe_drift(run, 1)
    assert f.step == 20 and "75.0%" in f.evidence and "2.5 nats" in f.evidence
    # 40 -> 10 tokens = 0.25x < 0.3: drifted though none is degenerate
    short = RunRecord(evals=_evals({"step": 0, "probe/mean_length": 40.0},
                                   {"step": 20, "probe/mean_length": 10.0}))  # fmt: skip
    assert probe_drift(short, 1) is not None
    assert probe_drift(RunRecord(evals=run.evals[:1]), 0) is None


def _records(prompts: list[str], answers: list[str], truths: list[str]) -> list[dict]:
    return [{"prompt": p, "completion": a, "ground_truth": t}
            for p, a, t in zip(prompts, answers, truths)]  # fmt: skip


def test_constant_answers_across_distinct_prompts():
    # 10 prompts, 6 answered "#### 5": share 60% >= 30%, and 5 is right for 1 of 10
    # prompts (10%): 60% >= 3 x 10%
    prompts = [f"q{i}" for i in range(10)]
    answers = ["#### 5"] * 6 + [f"#### {i}" for i in range(4)]
    truths = ["5"] + [str(100 + i) for i in range(9)]
    run = RunRecord(completions=[(7, _records(prompts, answers, truths))])
    f = constant_answers(run, 0)
    assert f.step == 7 and "'5'" in f.evidence and "6 of 10" in f.evidence
    varied = RunRecord(completions=[(7, _records(prompts, [f"#### {i}" for i in range(10)],
                                                 truths))])  # fmt: skip
    assert constant_answers(varied, 0) is None


def test_constant_answers_needs_eight_distinct_prompts():
    # one GRPO group: 8 samples of ONE prompt all answering 5 is agreement, not a guess
    run = RunRecord(completions=[(3, _records(["q"] * 8, ["#### 5"] * 8, ["7"] * 8))])
    assert constant_answers(run, 0) is None


def test_final_answer():
    assert final_answer("so 1,234 apples\n#### 1,234") == "1234"
    assert final_answer("The answer is Paris.") == "The answer is Paris."
    assert final_answer("") == ""
