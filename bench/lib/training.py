"""What the training-side benchmarks share: sizes, random-weight models, and the training
loop's own step timings and per-phase peaks.

A section runs at its real size, or with ``--tiny`` at a small one on a CPU (every code path,
timings meaningless). Random weights need no download; they are built directly on the
device in the benchmark's dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from bench.lib.common import DevicePeak, is_cuda, reset_peak


def pick_size(args, sizes: tuple[dict, dict]):
    """The (real, ``--tiny``) size pair of a section as a namespace, by ``args.tiny``."""
    from types import SimpleNamespace

    return SimpleNamespace(**sizes[1 if args.tiny else 0])


def shape(args, real: Callable):
    """(model config, dtype): the real shape in bf16, or a tiny Qwen2 in fp32 with --tiny."""
    import torch

    from danka.models import tiny

    if args.tiny:
        return tiny.tiny_config(tiny.tiny_tokenizer(), arch="qwen2"), torch.float32
    return real(), torch.bfloat16


def random_model(config, dev, dtype):
    """Random-weight causal LM built directly on ``dev`` in ``dtype`` (no CPU copy, no fp32
    detour: a 7B model is 15 GB). HF's init (normal_, std 0.02) runs on the device in
    seconds; skipping it would leave uninitialised memory (possible NaNs). Put in eval mode,
    the state ``danka.models.loading.load_causal_lm`` hands to the trainer, so the bench sees
    what a real run sees (see ``--train-mode``)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def gc_active(model) -> bool:
    """HF layers checkpoint only when ``gradient_checkpointing`` is set AND in train mode."""
    return any(getattr(m, "gradient_checkpointing", False) and m.training for m in model.modules())


def run_steps(run, steps: int, dev) -> dict:
    """``steps`` steps of the training loop; median over steps 2.. and per-phase peaks, as
    the loop itself measures them (``StepResult.seconds`` and ``.peaks_gib``, written as
    ``time/<phase>`` and ``memory/<phase>_peak_gib``); on CUDA also the device's own peak
    per step (``DevicePeak``: every byte in use, the CUDA context and vLLM's pool too)."""
    import statistics
    from collections import defaultdict

    from bench.lib.danka_side import packing_ratio, train_step

    per_step, peaks, device = [], defaultdict(float), []
    reset_peak(dev)
    for step in range(1, steps + 1):
        # the device's own count too (torch's does not see vLLM sleep)
        seen = DevicePeak(dev) if is_cuda(dev) else contextlib.nullcontext()
        with seen:
            result = train_step(run, step)
        if is_cuda(dev):
            device.append(seen.gib)
        batch, stats = result.scored.batch, result.scored.stats
        keep = {f"time/{phase}": s for phase, s in result.seconds.items()}
        keep["throughput/gen_tokens_per_s"] = result.scored.rollout.generated_tokens / max(
            result.seconds.get("rollout", 0.0), 1e-9
        )
        keep["packing/effective_token_ratio"] = packing_ratio(run, batch)
        keep["response_length"] = stats.response_length
        keep["response/truncated"] = stats.truncated
        keep["prompt_tokens_mean"] = float(batch.prompt_mask.sum(1).float().mean())
        per_step.append(keep)
        for phase, gib in result.peaks_gib.items():
            peaks[phase] = max(peaks[phase], gib)
        if result.peaks_gib:
            peaks["step"] = max(peaks["step"], *result.peaks_gib.values())
    later = per_step[1:] or per_step
    med = {k: statistics.median(s[k] for s in later) for k in later[0]}
    return {"steps": per_step, "median": med, "first_step_s": per_step[0]["time/step"],
            "median_step_s": med["time/step"],
            "phase_peak_gib": dict(peaks) if is_cuda(dev) else None,
            "device_peak_gib": max(device) if device else None,
            "device_peak_gib_by_step": device or None}  # fmt: skip


def synthetic_gsm8k(path: Path, rows: int, sentences: int) -> Path:
    """GSM8K-format rows (question/answer '#### n'); ``sentences`` x ~16 tokens per question."""
    import json

    import torch

    g = torch.Generator().manual_seed(0)
    names = ["Tom", "Maria", "Ali", "Chen", "Priya", "Lena", "Omar", "Kofi"]
    with path.open("w") as f:
        for i in range(rows):
            parts = []
            for s in range(sentences):
                a, b, c = torch.randint(2, 99, (3,), generator=g).tolist()
                parts.append(f"{names[(i + s) % 8]} buys {a} boxes of {b} pencils each and then "
                             f"gives {c} pencils to a friend at school.")  # fmt: skip
            q = " ".join(parts) + " How many pencils are left in total?"
            f.write(json.dumps({"question": q, "answer": f"Work it out. #### {i}"}) + "\n")
    return path
