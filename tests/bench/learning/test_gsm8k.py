"""bench/learning/gsm8k.py: a GSM8K run folder summarised against verl's PPO curve (a fake run)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bench.learning import gsm8k

CONFIG = {
    "model": {"actor_model_name_or_path": "model.gguf"},
    "trainer": {"algorithm": "ppo"},
    "data": {"task": "arithmetic", "eval_size": 30},
    "reward": {"functions": [
        {"name": "gsm8k", "label": "strict", "kwargs": {"method": "strict"}},
        {"name": "gsm8k", "label": "flexible", "weight": 0.0, "kwargs": {"method": "flexible"}},
        {"name": "gsm8k", "label": "boxed", "weight": 0.0, "kwargs": {"method": "boxed"}},
    ]},
}  # fmt: skip

# step, minute, n, strict, flexible, boxed, length
EVALS = [
    (0, 1.0, 1319, 0.001, 0.30, 0.29, 300.0),
    (10, 3.0, 500, 0.34, 0.35, 0.10, 260.0),
    (20, 5.0, 500, 0.40, 0.42, 0.05, 250.0),
    (40, 9.0, 500, 0.47, 0.48, 0.01, 240.0),
    (60, 14.5, 1319, 0.52, 0.53, 0.0, 230.0),
]


def fake_run(folder: Path) -> Path:
    (folder / "eval").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    for step, minute, n, strict, flexible, boxed, length in EVALS:
        data = {"step": step, "eval/n": n, "eval/accuracy": strict, "eval/minutes": minute,
                "eval/seconds": 20.0, "eval/correct/strict": strict,
                "eval/correct/flexible": flexible, "eval/correct/boxed": boxed,
                "eval/response_length": length, "eval/truncated": 0.01}  # fmt: skip
        if step == 0:
            data["eval/guess_floor"] = 0.03
        (folder / "eval" / f"step_{step}.json").write_text(json.dumps(data))
    lines = [{"step": s, "reward": 0.3, "time/step": 10.0, "time/rollout": 6.0,
              "memory/peak_gib": 10.0 + s / 100} for s in range(1, 61)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return folder


def test_a_run_is_summarised_with_milestones_and_goals(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    out = tmp_path / "res" / "r.json"
    assert gsm8k.main(["--run-dir", str(run), "--model", str(model), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["model"] == {"file": "model.gguf", "bytes": 104,
                          "sha256": hashlib.sha256(model.read_bytes()).hexdigest()}  # fmt: skip
    assert r["n"] == 1319 and r["guess_floor"] == 0.03
    assert (r["before"]["strict"], r["after"]["strict"]) == (0.001, 0.52)
    assert (r["before"]["boxed"], r["after"]["flexible"]) == (0.29, 0.53)
    assert [p["n"] for p in r["curve"]] == [1319, 500, 500, 500, 1319]
    assert r["wall_minutes_to_final_eval"] == 14.5
    # verl: 0.458 at 36 min (we: 0.47 at 9.0 -> 4x), 0.512 at 97 (0.52 at 14.5 -> 6.69x)
    m = {x["strict"]: x for x in r["milestones"]}
    assert (m[0.458]["minutes"], m[0.458]["speedup_vs_verl"]) == (9.0, 4.0)
    assert (m[0.512]["minutes"], m[0.512]["speedup_vs_verl"]) == (14.5, 6.69)
    assert not m[0.556]["reached"] and not m[0.569]["reached"]
    assert r["peak_gib"] == 10.6 and r["phase_seconds"] == {"rollout": 360.0, "step": 600.0}
    assert r["eval_seconds"] == 100.0 and r["steps"] == 60
    # the first evaluation at or above each mark: 34% at minute 3, 40% at minute 5
    assert r["minutes_to"] == {"0.3": 3.0, "0.33": 3.0, "0.36": 5.0, "0.38": 5.0}
    g = r["goals"]  # 33% by minute 3 (<= 4); 52% >= 38% at 14.5 min; flexible 53% >= 30 + 10
    assert g["fast_target"] == {"strict": 0.33, "minutes": 4.0, "reached_at": 3.0}
    assert g["strict_target"] == 0.38 and g["flexible_target"] == 0.4
    assert g["moonshot"] == {"strict": 0.45, "met": True}  # base flexible 30% + 15 points
    assert g["met"] == {
        "fast": True,
        "strict": True,
        "minutes": True,
        "flexible": True,
        "length": True,
        "doctor": r["doctor"]["problems"] == 0,
        "memory": True,
    }
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "strict 0.1% -> 52.0% (33% at 3.0 min; target 38.0%)" in capsys.readouterr().out


def test_goals_say_which_one_missed():
    curve = [
        {"minute": 1.0, "strict": 0.0, "flexible": 0.40, "mean_length": 300.0},
        {"minute": 4.5, "strict": 0.33, "flexible": 0.41, "mean_length": 200.0},
        {"minute": 25.0, "strict": 0.37, "flexible": 0.44, "mean_length": 140.0},
    ]
    g = gsm8k.goals(curve, wall=25.0, peak=30.0, doctor={"problems": 1})
    assert g["fast_target"]["reached_at"] == 4.5  # 33% after minute 4: missed
    assert g["flexible_target"] == 0.5 and g["moonshot"] == {"strict": 0.55, "met": False}
    assert g["met"] == {
        "fast": False,
        "strict": False,
        "minutes": False,
        "flexible": False,
        "length": False,
        "doctor": False,
        "memory": False,
    }
    assert not g["all_met"]
