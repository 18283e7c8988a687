"""bench/learning/learning.py summarises a finished run for any reward list (a fake run folder)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _module(name: str):
    folder = ROOT / "bench" / "learning"
    if str(folder) not in sys.path:  # as when run as a script: its folder is on the path
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CONFIG = {  # a reward list learning.py has never heard of: a custom function first
    "model": {"actor_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"},
    "trainer": {"algorithm": "grpo", "batch_size": 4, "samples_per_prompt": 4},
    "data": {"task": "arithmetic", "eval_size": 30},
    "reward": {"functions": [{"name": "gsm8k", "kwargs": {"method": "strict"}},
                             {"name": "last_number", "weight": 0.0}]},
}  # fmt: skip


def _fake_run(folder: Path, floor: float | None) -> Path:
    (folder / "eval").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    for step, acc, length in ((0, 0.2, 120.0), (12, 0.5, 100.0)):
        data = {"step": step, "eval/n": 30.0, "eval/accuracy": acc,
                "eval/correct/gsm8k": acc, "eval/correct/last_number": acc + 0.1,
                "eval/response_length": length, "eval/truncated": 0.02}  # fmt: skip
        if floor is not None and step == 0:
            data["eval/guess_floor"] = floor
        (folder / "eval" / f"step_{step}.json").write_text(json.dumps(data))
    lines = [{"step": s, "reward": 0.2 + 0.02 * s, "reward/gsm8k": 0.2 + 0.02 * s,
              "reward/last_number": 0.3, "response_length": 110.0, "time/step": 6.0}
             for s in range(1, 13)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return folder


def test_result_of_a_finished_run_with_a_recorded_floor(tmp_path, capsys):
    learning = _module("learning")
    run = _fake_run(tmp_path / "run", floor=0.04)
    out = tmp_path / "res" / "result.json"
    assert learning.main(["--run-dir", str(run), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["before"]["accuracy"] == 0.2 and r["after"]["accuracy"] == 0.5
    assert r["after"]["per_function"] == {"gsm8k": 0.5, "last_number": 0.6}
    assert (r["before"]["mean_length"], r["after"]["truncated"]) == (120.0, 0.02)
    assert r["guess_floor"] == 0.04 and r["guess_floor_source"].startswith("eval/guess_floor")
    assert r["steps"] == 12 and r["train_minutes"] == 1.2  # 12 x 6 s
    assert r["doctor"]["problems"] == 0 and r["config"] == CONFIG
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "20.0% -> 50.0%, guess floor 4.0%" in capsys.readouterr().out


def test_floor_computed_from_the_config_when_the_run_did_not_record_it(tmp_path):
    learning = _module("learning")
    run = _fake_run(tmp_path / "run", floor=None)
    out = tmp_path / "result.json"
    assert learning.main(["--run-dir", str(run), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["guess_floor_source"] == "computed from the config's 30 held-out rows"
    assert 0.0 <= r["guess_floor"] < 0.2
