"""``danka doctor RUN_DIR`` on fixtures trimmed from real danka runs (see
tests/diagnose/fixtures/README.md): exit 1 and the verdicts for collapsed runs, exit 0
for the quickstart, exit 2 for a folder that is not a run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from danka.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "diagnose" / "fixtures"
GRPO = FIXTURES / "gsm8k_grpo_h200"
QUICKSTART = FIXTURES / "quickstart_cpu"
PPO = FIXTURES / "gsm8k_ppo_h200"  # built from a real run (fixtures/README.md)


def _json(capsys, *args: str) -> tuple[int, dict]:
    rc = main(["doctor", *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_gsm8k_grpo_collapse_is_flagged(capsys):
    rc, report = _json(capsys, str(GRPO))
    assert rc == 1
    ids = {f["id"]: f for f in report["findings"]}
    # the collapse, from the metrics and the config
    for found in ("length_collapse", "bonus_dominates", "entropy_collapse", "zero_advantage",
                  "clip_cannot_act"):  # fmt: skip
        assert ids[found]["severity"] == "problem", found
    assert "'format'" in ids["bonus_dominates"]["what"]
    assert ids["length_collapse"]["step"] == 17
    # and against the floor the evaluation recorded: 2.0% after <= 3.0%
    assert "2.0%" in ids["below_guess_floor"]["evidence"]


def test_gsm8k_grpo_collapse_is_flagged_without_eval_files(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(GRPO, run)
    shutil.rmtree(run / "eval")
    rc, report = _json(capsys, str(run))
    ids = {f["id"] for f in report["findings"] if f["severity"] == "problem"}
    assert rc == 1 and {"length_collapse", "bonus_dominates"} <= ids
    assert "below_guess_floor" not in ids


@pytest.mark.skipif(not QUICKSTART.exists(), reason="fixture not built")
def test_quickstart_is_not_flagged(capsys):
    # examples/quickstart.yaml on 2 CPU cores: 36.5% -> 64.5% held out; KL on, nothing cut
    rc, report = _json(capsys, str(QUICKSTART))
    assert rc == 0 and report["problems"] == 0 and report["risks"] == 0, report["findings"]


@pytest.mark.parametrize("name", ["reasoning_grpo_h200", "reasoning_ppo_h200"])
def test_the_reasoning_examples_learning_runs_are_not_flagged(name, capsys):
    # examples/reasoning_{grpo,ppo}_smollm2.yaml on an H200, 5 minutes: held out 25.3% ->
    # 66.0% (GRPO) / 71.3% (PPO), floor 2.3%, answers 16.5 -> 16.7 tokens
    rc, report = _json(capsys, str(FIXTURES / name))
    assert rc == 0 and report["problems"] == 0 and report["risks"] == 0, report["findings"]


def _problems(capsys, run) -> tuple[int, set[str]]:
    rc, report = _json(capsys, str(run))
    return rc, {f["id"] for f in report["findings"] if f["severity"] == "problem"}


def test_gsm8k_ppo_below_the_floor_is_flagged_from_metrics_completions_and_config(tmp_path, capsys):
    # today's examples/gsm8k_ppo.yaml on SmolLM2 (H200): strict 0.2% -> 0.4% on the test
    # set, floor 3.0%; no sample ever earned a reward, which the metrics alone show
    run = tmp_path / "run"
    shutil.copytree(PPO, run)
    rc, ids = _problems(capsys, run)
    assert rc == 1 and {"no_reward", "below_guess_floor"} <= ids
    shutil.rmtree(run / "eval")
    rc, ids = _problems(capsys, run)
    assert rc == 1 and ids == {"no_reward"}


def test_gsm8k_grpo_below_the_floor_is_flagged(capsys):
    # today's examples/gsm8k_grpo.yaml on SmolLM2 (H200): strict 0.2% -> 0.2%, floor 3.0%
    rc, ids = _problems(capsys, FIXTURES / "gsm8k_grpo_floor_h200")
    assert rc == 1 and {"zero_advantage", "no_reward", "below_guess_floor"} <= ids


def test_a_policy_that_rambles_to_the_limit_is_flagged(capsys):
    # a PPO run on the reasoning task (H200, strict "####" reward the base model never
    # earned): held-out answers 94 -> 256 tokens, 4% -> 100% cut at the limit
    rc, ids = _problems(capsys, FIXTURES / "reasoning_ppo_runaway_h200")
    assert rc == 1 and {"no_reward", "runaway_length"} <= ids


def test_text_report(capsys):
    assert main(["doctor", str(GRPO)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"danka doctor {GRPO}: 145 steps")
    assert "[problem] length_collapse (step 17):" in out and "    fix: " in out
    assert out.rstrip().endswith("risk(s)")


def test_not_a_run_folder_exits_2(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "missing")]) == 2
    assert "run folder not found" in capsys.readouterr().err
    assert main(["doctor", str(tmp_path)]) == 2  # a folder without metrics or config
    assert "not a run folder" in capsys.readouterr().err
    assert main(["doctor", "--json"]) == 2  # --json is for RUN_DIR


def test_a_live_run_with_a_half_written_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.1}\n{"step": 2, "rew')
    rc, report = _json(capsys, str(tmp_path))
    assert rc == 0 and report["steps"] == 1


def test_a_run_whose_reward_overflowed_is_flagged(tmp_path, capsys):
    """Two weights of 1e308 summed to inf: such a run logged "reward": "inf" (and the loss
    NaN, the optimizer step skipped) and exited 0; the doctor saw no problem."""
    run = tmp_path / "run"
    run.mkdir()
    functions = [{"name": "last_number", "weight": 1e308}, {"name": "last_number", "weight": 1e308}]
    (run / "config.json").write_text(json.dumps({"reward": {"functions": functions}}))
    terms = {"reward/last_number": 1.0, "reward/last_number_2": 1.0, "skipped_step": 1.0}
    lines = [{"step": s, "loss": None, "reward": "inf", **terms} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rc, report = _json(capsys, str(run))
    ids = {f["id"]: f for f in report["findings"]}
    assert rc == 1, report
    found = ids["reward_not_finite"]
    assert found["severity"] == "problem" and found["step"] == 1
    assert "reward inf" in found["evidence"] and "1e+308" in found["evidence"]
    assert "reward.functions" in found["fix"]
    # the config alone says so too: the weights that config load now refuses
    assert "reward.functions[0].weight" in ids["reward_settings_refused"]["evidence"]
