"""Refactoring keeps the numbers: tiny CPU runs reproduce, bit for bit, the per-step
metrics, evaluations and result files recorded from the code before the step's state,
memory plan and evaluation were restructured (fixtures/same_numbers.json).

A deliberate change of numbers re-records the fixture (and says why in its commit):
``DANKA_RECORD_SAME_NUMBERS=1 python -m pytest tests/trainer/test_same_numbers.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from danka.config import load_config
from danka.trainer.fit import fit

from .conftest import make_config

FIXTURE = Path(__file__).parent / "fixtures" / "same_numbers.json"
RECORD = os.environ.get("DANKA_RECORD_SAME_NUMBERS") == "1"

# name -> the sections make_config updates (a small GRPO + LoRA run on the tiny model)
RUNS = {
    "grpo_lora_eval": dict(
        trainer={"total_steps": 3, "micro_batch_size": "auto"},
        data={"eval_size": 4},
        eval={"every_steps": 2},
        logging={"save_completions": 2},
    ),
    "ppo_critic": dict(
        trainer={
            "algorithm": "ppo",
            "samples_per_prompt": 1,
            "micro_batch_size": 1,
            "total_steps": 2,
            "ppo_epochs": 2,
        },
    ),  # fmt: skip
    "full_kl_packed": dict(
        lora={"enable_lora": False},
        trainer={"lr": 1e-3, "total_steps": 2, "kl": {"coef": 0.1, "estimator": "k3"}},
        data={"packing": True},
    ),
    "dapo_dynamic": dict(
        trainer={"algorithm": "grpo", "total_steps": 2},
        sampling={"dynamic_sampling": True, "max_sampling_rounds": 2},
    ),
}

TIMING = ("time/", "perf/", "memory/", "throughput/")
CLOCKED = ("eval/seconds", "eval/probe_seconds", "eval/minutes")  # an evaluation's own timing


def numbers(out: Path) -> dict:
    """What the run wrote, less what a clock or the machine decides."""
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    metrics = [
        {k: v for k, v in m.items() if not k.startswith(TIMING) and k != "timestamp"}
        for m in metrics
    ]
    evals = {}
    for path in sorted((out / "eval").glob("step_*.json")):
        record = json.loads(path.read_text())
        evals[path.name] = {k: v for k, v in record.items() if k not in CLOCKED}
    result = json.loads((out / "result.json").read_text())
    result.pop("seconds")
    completions = {
        p.name: p.read_text().splitlines() for p in sorted((out / "completions").glob("*.jsonl"))
    }
    return {"metrics": metrics, "eval": evals, "result": result, "completions": completions}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_tiny_run_reproduces_the_recorded_numbers(name, tmp_path, tiny_model_dir):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same reductions on any machine
    try:
        cfg, base = load_config(make_config(tmp_path, tiny_model_dir, **RUNS[name]))
        fit(cfg, base)
    finally:
        torch.set_num_threads(threads)
    got = json.loads(json.dumps(numbers(tmp_path / "out")))
    recorded = json.loads(FIXTURE.read_text()) if FIXTURE.is_file() else {}
    if RECORD:
        recorded[name] = got
        FIXTURE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    assert got == recorded[name]
