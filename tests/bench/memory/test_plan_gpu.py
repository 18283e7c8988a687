"""The memory plan against the measured peak on a GPU: |plan - measured| / measured <= 10%
for each config users run (bench/memory/plan_check.py measures them, all at once):

- ``seed``: examples/single_card_ppo.yaml verbatim at the Qwen2-7B shape (random weights,
  HF generate, no checkpointing), micro-batch auto under ``speed.gpu_memory=24GiB``;
- ``seed-mb4``: the same at micro-batch 4, uncapped;
- ``small-card``: the 7B bench config (fast engine, checkpointing, 24 GiB, auto);
- ``qwen05-grpo``: examples/gsm8k_grpo.yaml on Qwen2.5-Coder-0.5B-Instruct.

Needs ``DANKA_BENCH_GGUF`` (the Qwen2.5-Coder-0.5B-Instruct GGUF, or its HF folder: the
0.5B model and the seed's tokenizer) and GSM8K's train rows (``DANKA_BENCH_DATA``, default
data/gsm8k/train.jsonl); ``bash bench/gpu/speed.sh tests GGUF`` runs it (~6 minutes).
A failure prints every phase's plan and measured peak: what the planner gets wrong.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from bench.memory import plan_check

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ["seed", "seed-mb4", "small-card", "qwen05-grpo"]
GGUF = os.environ.get("DANKA_BENCH_GGUF", "")
DATA = Path(os.environ.get("DANKA_BENCH_DATA", "data/gsm8k/train.jsonl"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    if not GGUF or not Path(GGUF).exists():
        pytest.skip("set DANKA_BENCH_GGUF to the Qwen2.5-Coder-0.5B-Instruct GGUF")
    data = DATA if DATA.is_absolute() else ROOT / DATA
    if not data.is_file():
        pytest.skip(f"no GSM8K rows at {data} (DANKA_BENCH_DATA)")
    out = tmp_path_factory.mktemp("plan_check")
    plan_check.main([
        "--gguf", GGUF, "--gsm8k-data", str(data), "--configs", ",".join(CONFIGS),
        "--parallel", "--out-dir", str(out), "--name", "plan_gpu",
    ])  # fmt: skip
    return json.loads((out / "plan_gpu.json").read_text())["configs"]


@pytest.mark.parametrize("name", CONFIGS)
def test_plan_within_10pct_of_measured(measured, name):
    r = measured[name]
    assert "vs_plan" in r, f"{name}: not measured: {r.get('error')} {r.get('log_tail', '')}"
    vs = r["vs_plan"]
    phases = ", ".join(
        f"{k} plan {v['estimate_gib']:.2f} / measured {v['measured_gib'] or 0:.2f} GiB"
        for k, v in vs.items()
        if k != "within_15pct"
    )
    err = vs["step"]["rel_error"]
    assert abs(err) <= plan_check.TOLERANCE, f"{name}: step {err:+.1%} ({phases})"
