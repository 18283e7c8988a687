"""Held-out evaluation: greedy answers scored by the reward function."""

from __future__ import annotations

import torch

from danka.rollout.base import SamplingParams
from danka.types import PromptRow


@torch.no_grad()
def evaluate(run, rows: list[PromptRow], prompt_ids: list[list[int]], texts: list[str]) -> dict:
    """Greedy accuracy on held-out prompts.

    A sample counts as correct when the primary reward function (the first one) gives it
    at least 1.0, the score of a correct answer for every builtin rule reward. The same is
    reported per function (``eval/correct/<name>``): a weight-0 function is a pure metric,
    e.g. GSM8K's flexible accuracy next to the strict one.
    """
    t = run.cfg.trainer
    params = SamplingParams(
        n=1, temperature=0.0, max_new_tokens=t.eval_max_new_tokens or t.max_new_tokens
    )
    chunk = run.cfg.rollout.generation_batch_size or 256
    completions: list[str] = []
    lengths, truncated = [], []
    with run.models.actor():
        for start in range(0, len(prompt_ids), chunk):
            batch = run.engine.generate(
                run.models.policy,
                prompt_ids[start : start + chunk],
                params,
                eos_ids=run.eos_ids,
                pad_id=run.pad_id,
            )
            completions.extend(run.decode(batch))
            lengths.extend(batch.response_mask.sum(1).tolist())
            truncated.extend(batch.truncated.tolist())
    out = run.rewards(rows, texts, completions)
    primary = next(iter(out.per_function.values())) if out.per_function else out.scores
    correct = (primary.float() >= 1.0 - 1e-6).float()
    per_fn = {
        f"eval/correct/{name}": float((v.float() >= 1.0 - 1e-6).float().mean())
        for name, v in out.per_function.items()
    }
    return {
        **per_fn,
        "eval/accuracy": float(correct.mean()),
        "eval/reward": float(out.scores.float().mean()),
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        "eval/truncated": sum(truncated) / max(1, len(truncated)),
        "eval/n": float(len(rows)),
        "_samples": [
            {"prompt": p, "completion": c, "ground_truth": r.ground_truth, "correct": bool(k)}
            for p, c, r, k in zip(texts[:16], completions[:16], rows[:16], correct[:16].tolist())
        ],
    }
