"""bench/calc_tool_learning.py reads a finished run: before/after held-out accuracy with the
tool, the valid-call rates, the training curve (a fake run folder, written by hand)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    if str(ROOT / "bench") not in sys.path:  # as when run as a script: its folder is on the path
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(
        "calc_tool_learning", ROOT / "bench/calc_tool_learning.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    out = _module().summarize_run(tmp_path)
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
    }
    assert out["example_trajectories"][0]["completion"][0]["content"] == "x"
