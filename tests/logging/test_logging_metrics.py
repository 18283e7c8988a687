"""Step line order, metrics.jsonl strict JSON with NaN/inf, truncation on resume, completions."""

from __future__ import annotations

import json

import torch

from danka.logging import (
    CompletionsWriter,
    MetricsWriter,
    format_step_line,
    remove_completions_after,
    truncate_metrics_after,
)


def test_format_step_line_order_and_format():
    metrics = {
        "time/step": 5.2,
        "zeta": 3,
        "response_length": 42.14,
        "entropy": 1.23454,
        "kl": 0.0012,
        "reward": 0.5,
        "loss": torch.tensor(0.12344),
        "alpha": 2e-5,
    }
    assert format_step_line(3, metrics) == (
        "step 3 | loss: 0.1234, reward: 0.5000, kl: 0.0012, entropy: 1.2345, "
        "response_length: 42.1, alpha: 2.00e-05, zeta: 3, time/step: 5.20s"
    )


def test_format_step_line_always_has_loss_and_reward():
    assert format_step_line(1, {"kl": 0.5}) == "step 1 | loss: nan, reward: nan, kl: 0.5000"


def test_metrics_jsonl_valid_with_nan(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write(1, {"loss": float("nan"), "reward": float("inf"), "kl": -float("inf")})
        w.write(2, {"loss": torch.tensor(0.5), "hist": [1.0, float("nan")], "name": "x"})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # strict: no NaN tokens
    assert "NaN" not in lines[0] and "Infinity" not in lines[0]
    assert records[0]["step"] == 1 and records[0]["loss"] is None
    assert records[0]["reward"] == "inf" and records[0]["kl"] == "-inf"
    assert records[1]["loss"] == 0.5 and records[1]["hist"] == [1.0, None]
    assert records[1]["name"] == "x"


def test_truncate_metrics_after(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(1, 6):
            w.write(step, {"reward": step / 10})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')  # half a line from a killed run
    assert truncate_metrics_after(tmp_path, 3) == 3  # steps 4, 5 and the broken line
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    with MetricsWriter(tmp_path) as w:  # the redone steps append after step 3
        w.write(4, {"reward": 0.9})
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert truncate_metrics_after(tmp_path / "missing", 1) == 0


def test_writer_repairs_partial_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo')
    with MetricsWriter(tmp_path) as w:
        w.write(2, {"loss": 1.0})
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and records[1]["loss"] == 1.0


def test_completions_writer(tmp_path):
    path = CompletionsWriter(tmp_path).write(
        7,
        prompts=["1+1?", [{"role": "user", "content": "2+2?"}]],
        completions=["2", "5"],
        rewards=[1.0, float("nan")],
        reward_parts={"accuracy": [1.0, 0.0], "format": [0.0, None]},
        ground_truths=["2", "4"],
    )
    assert path == tmp_path / "completions" / "step_7.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows[0] == {
        "step": 7,
        "prompt": "1+1?",
        "completion": "2",
        "reward": 1.0,
        "rewards": {"accuracy": 1.0, "format": 0.0},
        "ground_truth": "2",
    }
    assert rows[1]["prompt"][0]["content"] == "2+2?" and rows[1]["reward"] is None
    CompletionsWriter(tmp_path).write(9, prompts=["p"], completions=["c"], rewards=[0.0])
    assert remove_completions_after(tmp_path, 7) == 1
    assert sorted(p.name for p in (tmp_path / "completions").iterdir()) == ["step_7.jsonl"]


def test_the_short_step_line_keeps_what_says_how_the_step_went():
    metrics = {
        **{"time/step": 5.2, "time/rollout": 3.0, "actor/clipfrac": 0.1, "kl": 0.0012},
        **{"actor/entropy": 1.23454, "response_length": 42.14, "reward": 0.5, "loss": 0.1},
    }
    assert format_step_line(3, metrics, verbose=False) == (
        "step 3 | loss: 0.1000, reward: 0.5000, kl: 0.0012, actor/entropy: 1.2345, "
        "response_length: 42.1, time/step: 5.20s"
    )
