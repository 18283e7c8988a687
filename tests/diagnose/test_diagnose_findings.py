"""The two ways to run the checks agree; each finding is reported once."""

import pytest

from danka.diagnose import CHECKS, CheckMeta, Finding, LiveDiagnoser, RunRecord, diagnose
from danka.diagnose.settings import reward_terms, setting

CONFIG = {
    "trainer": {"batch_size": 8, "mini_batch_size": 8, "ppo_epochs": 1, "clip_ratio_high": 0.28,
                "lr": 1e-5},
    "reward": {"functions": [{"name": "gsm8k", "kwargs": {"method": "strict"}},
                             {"name": "format", "weight": 0.1}]},
}  # fmt: skip


def _metrics(n: int = 30) -> list[dict]:
    # length 200 -> 20 from step 11, format rises to 1 from step 11, entropy 2 -> 0.1
    out = []
    for s in range(1, n + 1):
        late = s > 10
        out.append({
            "step": s,
            "reward": 0.1 if late else 0.0,
            "reward/gsm8k": 0.0,
            "reward/format": 1.0 if late else 0.0,
            "response_length": 20.0 if late else 200.0,
            "actor/entropy": 0.1 if late else 2.0,
            "reward/zero_adv_groups": 0.9 if late else 0.2,
        })  # fmt: skip
    return out


def test_live_and_whole_run_give_the_same_findings_at_the_same_steps():
    run = RunRecord(config=CONFIG, metrics=_metrics())
    whole = {f.id: f.step for f in diagnose(run)}
    doc = LiveDiagnoser(CONFIG)
    live = {f.id: None for f in doc.start()}
    for m in run.metrics:
        for f in doc.observe(m["step"], {k: v for k, v in m.items() if k != "step"}):
            live[f.id] = m["step"]
            assert f.step == m["step"]  # warned the step it first held
    assert live == whole
    # medians of the last 5 need 3 collapsed steps (11-13) to move: step 13; the bonus
    # uses means: at step 11 format's mean is 1/5, a gain of 0.1 x 0.2 = 0.02 >= 0.01, all
    # of it from format; zero-advantage needs 10 steps above 0.8: steps 11-20; the reward
    # is 0 on steps 1-10: no_reward at step 10
    assert whole == {
        "clip_cannot_act": None, "length_collapse": 13, "bonus_dominates": 11,
        "entropy_collapse": 13, "zero_advantage": 20, "no_reward": 10,
    }  # fmt: skip


def test_each_finding_is_reported_once():
    doc = LiveDiagnoser(CONFIG)
    assert [f.id for f in doc.start()] == ["clip_cannot_act"]
    assert doc.start() == []
    seen = [f.id for m in _metrics(40) for f in doc.observe(m["step"], m)]
    assert len(seen) == len(set(seen))


def test_finish_judges_the_last_evaluation():
    doc = LiveDiagnoser({})
    assert doc.observe_eval(0, {"eval/accuracy": 0.003, "eval/guess_floor": 0.03}) == []
    assert doc.observe_eval(50, {"eval/accuracy": 0.02}) == []  # final checks wait
    [f] = doc.finish()
    assert f.id == "below_guess_floor" and f.step == 50
    assert doc.finish() == []


def test_message_and_severity_come_from_the_registry():
    f = Finding("x", "what", "evidence", "fix it", step=3)
    assert f.message() == "what (step 3: evidence); fix: fix it"
    assert Finding("x", "w", "e", "f").message().startswith("w (at start-up: e)")
    assert CHECKS.meta("kl_off_high_lr").severity == "risk"
    assert CHECKS.meta("below_guess_floor") == CheckMeta(reads="evals", final=True)
    with pytest.raises(ValueError, match="already registered"):
        CHECKS.register("length_collapse")(lambda run, at: None)


def test_settings_read_the_first_path_present_and_name_reward_terms_as_metrics():
    assert setting({"trainer": {"lr": 3e-5}}, "lr") == 3e-5
    assert setting({}, "lr") == 1e-5  # the schema default
    config = {
        "reward": {
            "functions": [{"name": "gsm8k"}, {"name": "gsm8k", "weight": 0.5},
                          {"name": "rewards/mine.py:score", "weight": 0.2}],
            "model_weight": 0.3, "overlong_buffer": {"length": 64},
        },
        "model": {"reward_model_name_or_path": "rm"},
    }  # fmt: skip
    terms = [(t.key, t.weight, t.primary) for t in reward_terms(config)]
    assert terms == [("gsm8k", 1.0, True), ("gsm8k_2", 0.5, False), ("score", 0.2, False),
                     ("reward_model", 0.3, False), ("overlong", 1.0, False)]  # fmt: skip


def test_reward_terms_are_named_by_their_label_when_set():
    # examples/gsm8k_*: one function trained, three logged (reward/strict, reward/flexible...)
    config = {"reward": {"functions": [
        {"name": "gsm8k", "weight": 1.0, "label": "strict"},
        {"name": "gsm8k", "weight": 0.0, "label": "flexible"},
        {"name": "gsm8k", "weight": 0.0},
    ]}}  # fmt: skip
    terms = [(t.key, t.weight) for t in reward_terms(config)]
    assert terms == [("strict", 1.0), ("flexible", 0.0), ("gsm8k", 0.0)]
