"""The red team's cases that danka already handled, kept green: each bad input is one
message (exit 2) naming the file, line or key, with a fix and no traceback; nothing of
the user's code runs that the config did not name. (Signals mid-step, kill -9 during
saves, the run lock and resume refusals have their own tests: tests/trainer/test_signals.py,
test_kill.py, tests/test_lifecycle.py, tests/test_bad_input.py.)"""

from __future__ import annotations

import json

import pytest

from danka.cli import main
from danka.config import load_config
from danka.errors import UserError
from danka.logging.runlog import close_run_logger

from .conftest import one_step_config

BASE = "model:\n  actor_model_name_or_path: m\ndata:\n  train_dataset: rows.jsonl\n"


@pytest.mark.parametrize(
    "text, words",
    [
        ("trainer:\n  lr: 1\n    bad: x\n", ("c.yaml:7", "invalid YAML")),  # syntax
        ("trainer:\n  batch_size: four\n", ("c.yaml:6", "expected int")),  # type
        ("trainer:\n  lr: -1.0\n", ("c.yaml:6", "must be > 0")),  # range
        ("trainer:\n  batch_sise: 4\n", ("c.yaml:6", "did you mean trainer.batch_size")),
    ],
    ids=["yaml_syntax", "wrong_type", "out_of_range", "unknown_key"],
)
def test_config_mistakes_name_the_line(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(BASE + text)
    with pytest.raises(UserError) as err:
        load_config(path)
    for word in words:
        assert word in str(err.value), str(err.value)
    assert err.value.fix


def _fails(capsys, argv, *words):
    try:
        code = main(argv)
    finally:
        close_run_logger()
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err
    message = err[err.index("danka: error:") :]
    for word in words:
        assert word in message, message
    assert "fix:" in message


@pytest.mark.parametrize(
    "rows, words",
    [
        (b'{"prompt": "caf\xe9", "answer": "1"}\n', ("rows.jsonl", "not UTF-8")),
        (b'{"prompt": "1+1?", "answer": "2"}\n', ("usable training prompts", "fewer than")),
    ],
    ids=["non_utf8_data", "too_few_rows"],
)
def test_data_mistakes(tmp_path, model_dir, capsys, rows, words):
    config = one_step_config(tmp_path, model_dir)
    (tmp_path / "rows.jsonl").write_bytes(rows)
    _fails(capsys, ["train", str(config)], *words)


REWARDS = {
    "returns_a_string": ("return ['high' for _ in completions]", "returned a str"),
    "wrong_length": ("return [1.0]", "returned 1 values for"),
    "raises": ("raise ValueError('bad reward')", "ValueError: bad reward"),
    "sleeps": ("import time; time.sleep(60)\n    return [1.0] * len(completions)", "timed out"),
    "exits_in_a_call": ("import os; os._exit(3)", "died (exit code 3)"),
}


@pytest.mark.parametrize("body, words", REWARDS.values(), ids=REWARDS.keys())
def test_reward_functions_that_misbehave_are_caught_before_training(
    tmp_path, model_dir, capsys, body, words
):
    config = one_step_config(tmp_path, model_dir, reward={"timeout_s": 2})
    (tmp_path / "reward.py").write_text(
        f"def reward(prompts, completions, **columns):\n    {body}\n"
    )
    _fails(capsys, ["train", str(config)], "before training", words)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_reward_file_outside_the_config_folder_runs_only_when_named(tmp_path, model_dir, capsys):
    """Only the file the config names is loaded: a same-named module elsewhere is not."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "reward.py").write_text("raise SystemExit('the wrong file ran')\n")
    run = tmp_path / "run"
    run.mkdir()
    config = one_step_config(run, model_dir)
    try:
        assert main(["train", str(config)]) == 0
    finally:
        close_run_logger()
    assert "the wrong file ran" not in capsys.readouterr().err
    assert json.loads((run / "out" / "result.json").read_text())["steps"] == 1
