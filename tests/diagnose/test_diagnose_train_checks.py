"""Checks on training metrics, on small hand-made histories (numbers worked in comments)."""

from danka.diagnose import RunRecord, diagnose
from danka.diagnose.checks_train import (
    bonus_dominates,
    entropy_collapse,
    length_collapse,
    truncation_at_start,
    zero_advantage,
)

GSM8K_FORMAT = {
    "reward": {
        "functions": [
            {"name": "gsm8k", "weight": 1.0, "kwargs": {"method": "strict"}},
            {"name": "format", "weight": 0.1, "kwargs": {}},
        ]
    }
}


def _history(**series: list[float]) -> list[dict]:
    n = len(next(iter(series.values())))
    return [{"step": i + 1, **{k.replace("__", "/"): v[i] for k, v in series.items()}}
            for i in range(n)]  # fmt: skip


def _first(check, run: RunRecord):
    """(step, finding) of the first position where ``check`` holds, as diagnose scans."""
    for at in range(len(run.metrics)):
        f = check(run, at)
        if f is not None:
            return f.step, f
    return None, None


def test_length_collapse_while_reward_rises():
    # steps 1-5: median 200 tokens, reward 0; steps 6-10: median 40 (0.2x < 0.3), reward 0.1
    # (> 0 + 0.01): flagged at step 10, the first step with 5 + 5 points
    run = RunRecord(metrics=_history(response_length=[200] * 5 + [40] * 5,
                                     reward=[0.0] * 5 + [0.1] * 5))  # fmt: skip
    step, f = _first(length_collapse, run)
    assert step == 10 and "200 tokens" in f.evidence and "0.2x" in f.evidence


def test_length_collapse_needs_a_rising_reward_and_reasoning_to_lose():
    flat = RunRecord(metrics=_history(response_length=[200] * 5 + [40] * 5, reward=[0.1] * 10))
    assert _first(length_collapse, flat)[0] is None  # reward 0.1 -> 0.1: not rising
    # 14 -> 3 tokens (a "reply with only the number" task): under 32 at the start
    short = RunRecord(metrics=_history(response_length=[14] * 5 + [3] * 5,
                                       reward=[0.2] * 5 + [0.6] * 5))  # fmt: skip
    assert _first(length_collapse, short)[0] is None
    # 200 -> 70 tokens is 0.35x: shorter, not collapsed
    mild = RunRecord(metrics=_history(response_length=[200] * 5 + [70] * 5,
                                      reward=[0.0] * 5 + [0.1] * 5))  # fmt: skip
    assert _first(length_collapse, mild)[0] is None


def test_bonus_supplies_most_of_the_gain():
    # gains (trailing 5 mean - first 5 mean) x weight: gsm8k 1.0 x 0.01 = 0.01,
    # format 0.1 x (1.0 - 0.0) = 0.1; total 0.11, format's share 0.1 / 0.11 = 90.9% > 50%
    run = RunRecord(config=GSM8K_FORMAT, metrics=_history(
        reward__gsm8k=[0.0] * 5 + [0.01] * 5, reward__format=[0.0] * 5 + [1.0] * 5,
    ))  # fmt: skip
    step, f = _first(bonus_dominates, run)
    assert step == 10 and "'format'" in f.what and "90.9%" in f.evidence


def test_bonus_check_quiet_when_correctness_leads():
    # gsm8k +0.5, format 0.1 x 1.0 = 0.1: the bonus is 0.1 / 0.6 = 16.7% of the gain
    run = RunRecord(config=GSM8K_FORMAT, metrics=_history(
        reward__gsm8k=[0.0] * 5 + [0.5] * 5, reward__format=[0.0] * 5 + [1.0] * 5,
    ))  # fmt: skip
    assert _first(bonus_dominates, run)[0] is None
    # one function only (the quickstart): nothing to compare
    alone = RunRecord(config={"reward": {"functions": [{"name": "last_number"}]}},
                      metrics=_history(reward__last_number=[0.2] * 5 + [0.6] * 5))  # fmt: skip
    assert _first(bonus_dominates, alone)[0] is None


def test_entropy_collapse_below_a_tenth():
    # median 2.0 -> 0.1 = 0.05x < 0.1: flagged; 2.0 -> 0.5 = 0.25x: not
    run = RunRecord(metrics=_history(actor__entropy=[2.0] * 5 + [0.1] * 5))
    assert _first(entropy_collapse, run)[0] == 10
    ok = RunRecord(metrics=_history(actor__entropy=[2.0] * 5 + [0.5] * 5))
    assert _first(entropy_collapse, ok)[0] is None


def test_zero_advantage_for_ten_steps_in_a_row():
    # steps 1-4 above 0.8, step 5 at 0.5 breaks the run, steps 6-15 above 0.8: ten in a
    # row end at step 15
    z = [0.9] * 4 + [0.5] + [0.95] * 10
    run = RunRecord(metrics=_history(reward__zero_adv_groups=z))
    step, f = _first(zero_advantage, run)
    assert step == 15 and "steps 6-15" in f.evidence
    nine = RunRecord(metrics=_history(reward__zero_adv_groups=[1.0] * 9))
    assert _first(zero_advantage, nine)[0] is None


def test_truncation_at_start_is_a_risk():
    # first three steps 0.6, 0.5, 0.4: median 0.5 > 0.3 -> at step 3
    run = RunRecord(config={"trainer": {"max_new_tokens": 256}},
                    metrics=_history(response__truncated=[0.6, 0.5, 0.4, 0.0]))  # fmt: skip
    step, f = _first(truncation_at_start, run)
    assert step == 3 and "mask_truncated" in f.fix
    [found] = diagnose(run)
    assert found.id == "truncation_at_start" and found.severity == "risk"
    # median of 0.1, 0.6, 0.2 is 0.2
    ok = RunRecord(metrics=_history(response__truncated=[0.1, 0.6, 0.2]))
    assert _first(truncation_at_start, ok)[0] is None


def test_a_reward_that_is_not_finite_is_flagged_at_its_first_step():
    """metrics.jsonl writes inf as "inf" and NaN as null; a term's mean alike."""
    from danka.diagnose.checks_train import reward_not_finite

    run = RunRecord(metrics=_history(reward=[0.5, 0.5, "inf", "inf"]), config=GSM8K_FORMAT)
    step, f = _first(reward_not_finite, run)
    assert step == 3 and "reward inf" in f.evidence and "format 0.1" in f.evidence
    term = RunRecord(metrics=_history(reward=[0.5] * 3, reward__format=[0.1, None, 0.1]))
    step, f = _first(reward_not_finite, term)
    assert step == 2 and "reward/format NaN" in f.evidence
    assert _first(reward_not_finite, RunRecord(metrics=_history(reward=[0.5] * 4)))[0] is None
