"""bench.learning.calc_tool_learning reads a finished run: before/after held-out accuracy with the
tool, the valid-call rates, the training curve (a fake run folder, written by hand)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.learning import calc_tool_learning
from bench.learning.calc_tool_heldout import split_rows

ROOT = Path(__file__).resolve().parents[3]


def test_summarize_run_before_and_after(tmp_path):
    (tmp_path / "eval").mkdir()
    for step, acc, calls in ((0, 0.05, 0.25), (20, 0.4, 0.75), (9, 0.2, 0.5)):
        data = {
            "step": step,
            "eval/n": 200.0,
            "eval/accuracy": acc,
            "eval/agent/valid_call_samples": calls,
            "eval/agent/valid_call_rate": 0.9,
            "eval/agent/tool_calls": calls,
            "samples": [{"completion": [{"role": "assistant", "content": "x"}]}],
        }
        (tmp_path / "eval" / f"step_{step}.json").write_text(json.dumps(data))
    lines = [
        {"step": s, "reward": 0.1 * s, "agent/valid_call_samples": 0.3, "time/step": 30.0}
        for s in (1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = calc_tool_learning.summarize_run(tmp_path)
    # evaluations sorted by step (file order is not): 0 -> 9 -> 20
    assert [e["step"] for e in out["evaluations"]] == [0, 9, 20]
    assert out["before"]["accuracy"] == 0.05 and out["after"]["accuracy"] == 0.4
    assert (
        out["before"]["valid_call_samples"] == 0.25 and out["after"]["valid_call_samples"] == 0.75
    )
    assert out["after"]["n"] == 200 and out["after"]["turns"] is None  # not logged: None
    assert out["steps"] == 2 and out["train_minutes"] == 1.0  # 2 x 30 s
    assert out["train_curve"][1] == {
        "step": 2,
        "reward": 0.2,
        "agent/valid_call_samples": 0.3,
        "agent/valid_call_rate": None,
        "agent/tool_calls": None,
        "agent/prefill_tokens": None,  # not logged (no kv reuse metrics): None
        "agent/reused_tokens": None,
        "time/rollout": None,
    }
    assert out["example_trajectories"][0]["completion"][0]["content"] == "x"


def test_sampled_before_uses_the_base_and_after_the_last_checkpoint(tmp_path, monkeypatch):
    """--eval-samples K: the base model, then the run's newest complete checkpoint, each
    evaluated on the config's held-out rows (first --eval-n) at trainer.temperature."""
    import argparse

    from danka.checkpoint import save_checkpoint

    mod = calc_tool_learning
    for step in (3, 6):  # the newest complete one is 6
        save_checkpoint(
            tmp_path,
            step,
            {"actor": lambda d: (d / "model.safetensors").write_bytes(b"w")},
            trainer_state={"step": step},
            config_hash="h",
            keep_last=None,
        )
    seen = []
    monkeypatch.setattr(mod, "load_policy", lambda cfg, weights: (object(), weights))
    monkeypatch.setattr(
        mod,
        "measure",
        lambda model, tok, cfg, base_dir, rows, k, temp, batch: (
            seen.append((tok, len(rows), k, temp, batch)) or {"n": len(rows), "accuracy": 0.5}
        ),
    )
    args = argparse.Namespace(
        config=str(ROOT / "examples/calculator_tool.yaml"),
        overrides=["data.eval_size=8", "trainer.temperature=0.7"],
        eval_samples=4,
        eval_n=5,
        eval_batch=64,
    )
    out = mod.sampled_before_after(args, tmp_path)
    after = str(tmp_path / "actor" / "checkpoint_6")
    assert seen == [(None, 5, 4, 0.7, 64), (after, 5, 4, 0.7, 64)]
    assert out["sampled_before"]["weights"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert out["sampled_after"]["weights"] == after and out["sampled_after"]["accuracy"] == 0.5


def test_harder_held_out_splits_are_right_and_held_out():
    from danka.data.calc_task import calc_split

    for row in split_rows("two_ops", 20):  # "What is a * b + c?": one calculator expression
        expr = row.prompt.removeprefix("What is ").removesuffix("?")
        a, b = (int(x) for x in expr.split(" ")[0:3:2])
        assert eval(expr) == int(row.ground_truth) and calc_split(a, b) == "test"
    for row in split_rows("digits5x4", 20):
        a, b = row.extra["a"], row.extra["b"]
        assert 10000 <= a <= 99999 and 1000 <= b <= 9999 and row.extra["split"] == "test"
