"""What both sides of ``python -m bench trl`` are set to, per task, and the GSM8K task's
rows, reward and TRL's rollout clock (bench/peers/vs_trl.py runs the sides)."""

from __future__ import annotations

import time
from pathlib import Path

from bench.lib.gsm8k_data import data_path, example, gsm8k_rows


def settings(args) -> dict:
    """What both sides are set to: ``--task sum`` (the TRL anchor: a + b prompts, last-number
    reward, lr 2e-4 LoRA / 1e-5 full, beta 0, LoRA r16, gradient checkpointing) or
    ``--task gsm8k`` (examples/gsm8k_grpo.yaml's: GSM8K questions with its instruction,
    verl's strict reward, its LoRA lr and r32/alpha 64 all-linear, its KL coefficient as
    beta, 1e-6 full-parameter, no checkpointing, its max_length). ``--gc on|off`` overrides
    the checkpointing. Both tasks: one optimizer step per rollout (the example takes two)."""
    task, gc = getattr(args, "task", "sum"), getattr(args, "gc", "auto")
    if task == "gsm8k":
        ex = example()
        out = {"lr_lora": float(ex["optim"]["lr"]), "lr_full": 1e-6,
               "beta": float(ex["loss"]["kl"]["coef"]), "lora_r": ex["lora"]["lora_r"],
               "lora_alpha": ex["lora"]["lora_alpha"], "gc": False,
               "max_length": ex["trainer"]["max_length"],
               "instruction": ex["data"]["instruction"]}  # fmt: skip
    else:
        out = {"lr_lora": 2e-4, "lr_full": 1e-5, "beta": 0.0, "lora_r": 16, "lora_alpha": 32,
               "gc": True, "max_length": args.new_tokens + 128, "instruction": None}  # fmt: skip
    if gc != "auto":
        out["gc"] = gc == "on"
    out["lr"] = out["lr_lora"] if args.variant == "lora" else out["lr_full"]
    return out


def gsm8k_data(args) -> Path:
    return data_path(args.gsm8k_data)


def trl_rows(args, n: int) -> list[dict]:
    """The first ``n`` GSM8K questions as TRL rows: one user message (question + the
    example's instruction, as danka builds it) and the ground truth."""
    from danka.data.template import build_messages

    instruction = settings(args)["instruction"]
    return [{"prompt": build_messages(r.prompt, instruction=instruction),
             "answer": r.ground_truth} for r in gsm8k_rows(args.gsm8k_data, n)]  # fmt: skip


def gsm8k_strict_reward(completions, answer, **_) -> list[float]:
    """verl's strict GSM8K score through danka's own ``gsm8k`` reward (the number after the
    last "####" equals the ground truth)."""
    from danka.rewards.builtin import gsm8k
    from danka.types import PromptRow

    out = []
    for text, truth in zip(completions, answer):
        if not isinstance(text, str):  # chat completions: [{"role": "assistant", ...}]
            text = " ".join(m.get("content", "") for m in text)
        out.append(gsm8k(text, PromptRow(index=0, prompt="", ground_truth=truth)))
    return out


def time_generate(gen_s: list[float], cuda: bool) -> None:
    """Add each ``generate`` call's seconds (device synchronised) to ``gen_s[-1]``: TRL's
    rollout inside its step (this process only)."""
    import torch
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate

    def generate(self, *a, **k):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            if cuda:
                torch.cuda.synchronize()
            if not gen_s:
                gen_s.append(0.0)
            gen_s[-1] += time.perf_counter() - t0

    GenerationMixin.generate = generate
