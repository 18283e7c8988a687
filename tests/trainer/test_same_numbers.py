"""Refactoring keeps the numbers: tiny CPU runs reproduce the per-step metrics,
evaluations, result files and completions recorded from the code before the step's state,
memory plan and evaluation were restructured (fixtures/same_numbers.json). Completions and
every non-float value exactly; floats to a relative 1e-5 (:func:`differences`): one thread gives the same
reductions, but CPUs with other vector units (AVX2, AVX-512) round the last bits of a sum
differently (seen at 1e-8 between two x86 machines).

A deliberate change of numbers re-records the fixture (and says why in its commit):
``DANKA_RECORD_SAME_NUMBERS=1 python -m pytest tests/trainer/test_same_numbers.py``.
"""

from __future__ import annotations

import json
import math
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
    diff = differences(got, recorded[name])
    assert not diff, diff[:10]


def differences(got, want, path: str = "") -> list[str]:
    """Where ``got`` and ``want`` (JSON values) differ: floats beyond a relative 1e-5 (or
    1e-6 apart: a GRPO loss of mean-zero advantages is 1e-8 of rounding), anything else
    at all."""
    if isinstance(got, float) and isinstance(want, float):
        return [] if math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6) else [path]
    if isinstance(got, dict) and isinstance(want, dict):
        if got.keys() != want.keys():
            return [f"{path} keys {sorted(got.keys() ^ want.keys())}"]
        return [d for k in got for d in differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [
            d for i, (a, b) in enumerate(zip(got, want)) for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if got == want else [path]


def test_differences_allow_float_rounding_only():
    want = {"m": [{"kl": 0.0012593301944434643, "n": 3}], "text": ["a"]}
    assert not differences({"m": [{"kl": 0.0012593335704877973, "n": 3}], "text": ["a"]}, want)
    assert differences({"m": [{"kl": 0.0013, "n": 3}], "text": ["a"]}, want) == [".m[0].kl"]
    assert differences({"m": [{"kl": 0.0012593301944434643, "n": 4}], "text": ["a"]}, want)
    assert differences({"m": [{"kl": 0.0012593301944434643, "n": 3}], "text": ["b"]}, want)
