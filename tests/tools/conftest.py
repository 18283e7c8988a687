"""Shared pieces for the tools tests: a tiny model folder, a LoRA adapter with non-zero
``lora_B`` (so it changes the outputs), a prompts file, and a fake finished run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from danka.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def adapter_dir(tiny_dir, tmp_path_factory) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    model = get_peft_model(
        base,
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at 0 (a no-op adapter): make it act
                p.normal_(0.0, 0.5)
    out = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(str(out))
    return out


@pytest.fixture()
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [
        ("What is 1 + 1?", "yes"),
        ("What is 2 + 2?", "no"),
        ("Name a colour.", "yes"),
        ("Say hi.", "no"),
    ]
    path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows))
    return path


@pytest.fixture()
def yes_reward(tmp_path) -> Path:
    """A verl-style reward whose answer the test controls: 1 iff the ground truth is yes."""
    path = tmp_path / "yes_reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0 if ground_truth == 'yes' else 0.0\n"
    )
    return path


def write_fake_run(folder: Path, steps: int = 12, truncated_tail: bool = False) -> Path:
    """metrics.jsonl, eval/step_N.json and completions/step_N.jsonl like a finished run."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for s in range(1, steps + 1):
        lines.append(
            json.dumps(
                {
                    "step": s,
                    "timestamp": 1.0 * s,
                    "loss": 0.5 / s,
                    "reward": 0.1 + 0.05 * s,
                    "kl": 0.001 * s,
                    "actor/entropy": 1.0 - 0.02 * s,
                    "response_length": 40.0 + s,
                    "time/rollout": 2.0,
                    "time/reward": 0.1,
                    "time/prepare": 0.5,
                    "time/update": 1.0,
                    "time/step": 3.8,
                    "reward/gsm8k": 0.1 + 0.05 * s,
                    "grad_spike": "inf",  # non-finite values are written as strings
                    **({"eval/accuracy": 0.1 * s / steps} if s % 4 == 0 else {}),
                }
            )
        )
    text = "\n".join(lines) + "\n"
    if truncated_tail:
        text += '{"step": 13, "loss": 0.1, "rew'  # killed mid-write
    (folder / "metrics.jsonl").write_text(text)
    (folder / "eval").mkdir(exist_ok=True)
    for s, acc in ((0, 0.05), (steps, 0.3)):
        (folder / "eval" / f"step_{s}.json").write_text(
            json.dumps({"step": s, "eval/accuracy": acc, "eval/n": 20, "samples": []})
        )
    (folder / "completions").mkdir(exist_ok=True)
    for s, rewards in ((1, [0, 0, 1, 0]), (steps, [1, 1, 0, 1])):
        (folder / "completions" / f"step_{s}.jsonl").write_text(
            "".join(
                json.dumps({"step": s, "prompt": "p", "completion": "c", "reward": r}) + "\n"
                for r in rewards
            )
        )
    return folder


@pytest.fixture()
def make_run():
    return write_fake_run


def in_order(text: str, *parts: str) -> None:
    """Each of ``parts`` is in ``text``, after the one before it."""
    at = -1
    for part in parts:
        found = text.find(part, at + 1)
        assert found > at, f"{part!r} missing or out of order"
        at = found
