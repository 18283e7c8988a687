"""On 2 GPUs (NCCL): K training steps through ``danka train --nproc 2`` give the 1-GPU weights.

Runs ``python -m bench scale --only equivalence`` (GRPO LoRA and full-parameter in float32
and bfloat16, PPO with a critic in float32; greedy rollouts so both runs see the same
samples) and checks every case against its tolerance: rel = ||w_2 - w_1|| / ||w_1 - w_0||
<= 1e-3 in float32 (only the reduction order differs) and <= 5e-2 in bfloat16.
``DANKA_EQUIV_JSON`` names where the measured values go (bench/gpu/2x.sh sets it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_train_like_one(tmp_path):
    out = Path(os.environ.get("DANKA_EQUIV_JSON", tmp_path / "equivalence.json"))
    cmd = [sys.executable, "-m", "bench", "scale", "--only", "equivalence",
           "--work", str(tmp_path / "work"), "--out", str(out),
           "--budget-s", os.environ.get("DANKA_EQUIV_BUDGET_S", "330")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    cases = json.loads(out.read_text())["equivalence"]
    failed = {
        c["name"]: {k: c.get(k) for k in ("rel", "tolerance", "same_rollouts", "skipped")}
        | {"stderr": (c.get("two") or c["one"]).get("stderr", "")[-300:]}
        for c in cases
        if not c.get("pass")
    }
    assert len(cases) == 5 and not failed, failed
