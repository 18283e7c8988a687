"""bench plan-check on CPU: the comparison and its table worked by hand, the measured peaks
read from a danka train folder, gsm8k_step's JSON reused; a tiny end-to-end run."""

from __future__ import annotations

import json

import pytest

from bench.memory import plan_check


def test_with_plan_compares_each_phase_and_the_step():
    plan = {"phases_gib": {"rollout": 9.0, "prepare": 11.0, "update": 16.5}, "peak_gib": 16.5}
    res = {"phase_peak_gib": {"rollout": 10.0, "logprobs": 10.0, "values": 11.0,
                              "update": 15.0, "step": 15.0}}  # fmt: skip
    out = plan_check.with_plan(res, plan)
    assert out["vs_plan"]["step"]["rel_error"] == pytest.approx(0.1)  # (16.5 - 15) / 15
    assert out["ok"] is True  # within 10%
    res["phase_peak_gib"]["step"] = 14.0  # (16.5 - 14) / 14 = 18%
    assert plan_check.with_plan(res, plan)["ok"] is False
    row = plan_check.table_rows("seed", {**res, "micro_batch": 2})
    assert row.startswith("seed") and "+18%" in row and row.endswith("OFF")
    no_plan = plan_check.with_plan({"phase_peak_gib": None}, {"error": "boom"})
    assert "vs_plan" not in no_plan and "boom" in plan_check.table_rows("x", no_plan)


def test_measured_reads_the_loops_own_peaks(tmp_path):
    (tmp_path / "logs").mkdir()
    rows = [{"time/step": 9.0, "memory/rollout_peak_gib": 15.0, "memory/update_peak_gib": 17.0,
             "memory/peak_gib": 17.0},
            {"eval/accuracy": 0.5},
            {"time/step": 8.0, "memory/rollout_peak_gib": 15.5, "memory/update_peak_gib": 16.0,
             "memory/peak_gib": 16.0}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "logs" / "train.log").write_text(
        "[INFO] micro-batch 2, log-prob chunk 128 (auto: planned 21.4 of 24.0 GiB, peak in "
        "the update)\n[INFO] ppo (gae, ...): 3 steps x 4 prompts; micro-batch 2 sequences; 8\n"
    )
    m = plan_check.measured(tmp_path)
    assert m["steps"] == 2 and m["step_s"] == [9.0, 8.0] and m["micro_batch"] == 2
    assert m["phase_peak_gib"] == {"rollout": 15.5, "update": 17.0, "step": 17.0}
    assert m["auto_line"].startswith("micro-batch 2, log-prob chunk 128 (auto: planned 21.4")
    assert m["oom_retries"] == 0


def test_qwen_rows_come_from_gsm8k_steps_json(tmp_path):
    algo = {"phase_peak_gib": {"rollout": 4.0, "logprobs": 5.0, "update": 10.0, "step": 10.0},
            "sizes": {"micro_batch": 8}, "overrides": ["x=1"],
            "plan": {"phases_gib": {"rollout": 4.0, "prepare": 5.0, "update": 10.5},
                     "peak_gib": 10.5}}  # fmt: skip
    doc = {"result": {"sections": {"gsm8k_step": {"results": {"algos": {"grpo": algo}}}}}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    out = plan_check.from_step_json(f"{tmp_path / 'missing.json'},{path}", "grpo")
    assert out["micro_batch"] == 8 and out["ok"] is True
    assert out["vs_plan"]["update"]["rel_error"] == pytest.approx(0.05)
    assert "error" in plan_check.from_step_json(str(path), "ppo")


@pytest.mark.slow
def test_tiny_plan_check_runs_every_kind_of_config(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"question": f"What is {i} + 3?",
                    "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"}) + "\n" for i in range(8)))  # fmt: skip
    assert plan_check.main([
        "--tiny", "--device", "cpu", "--configs", "seed,small-card,qwen05-ppo", "--steps", "2",
        "--gsm8k-data", str(rows), "--out-dir", str(tmp_path), "--name", "p",
    ]) == 0  # fmt: skip
    res = json.loads((tmp_path / "p.json").read_text())
    assert "partial" not in res
    c = res["configs"]
    for name in ("seed", "small-card", "qwen05-ppo"):
        assert "error" not in c[name], c[name]
    assert c["seed"]["steps"] == 2 and c["seed"]["micro_batch"] == 4  # the seed's 4 x 1 on a CPU
    assert c["seed"]["plan"]["peak_phase"] in ("rollout", "prepare", "update")
    assert c["qwen05-ppo"]["plan"]["micro_batch_plan"].startswith("micro-batch")
    assert c["small-card"]["micro_batch_final"] == 2 and "plan" in c["small-card"]
