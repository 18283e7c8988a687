"""Held-out evaluation: greedy answers scored by the reward function."""

from __future__ import annotations

import torch

from danka.agent.rewards import AgentCompletion
from danka.rewards.combine import RewardOutput
from danka.rollout.base import SamplingParams
from danka.trainer.agent import agent_rollout
from danka.types import PromptRow

CORRECT_AT = 1.0  # the score of a right answer for every builtin rule reward


def judge(
    out: RewardOutput, threshold: float = CORRECT_AT
) -> tuple[torch.Tensor, dict[str, float]]:
    """The one "correct" rule (training evaluation and ``danka eval``): a sample is
    correct when the FIRST reward function scores it at least ``threshold`` (the combined
    score if there is no function). Returns (correct (B,) bool, per-function accuracy
    ``name -> fraction``: a weight-0 function is a pure metric, e.g. GSM8K's flexible
    accuracy next to the strict one)."""
    primary = next(iter(out.per_function.values())) if out.per_function else out.scores
    correct = primary.float() >= threshold - 1e-6
    per_fn = {
        name: float((v.float() >= threshold - 1e-6).float().mean())
        for name, v in out.per_function.items()
    }
    return correct.cpu(), per_fn


@torch.no_grad()
def evaluate(run, rows: list[PromptRow], prompt_ids: list[list[int]], texts: list[str]) -> dict:
    """Greedy accuracy on held-out prompts (through the agent loop with ``run.agent``:
    ``eval/agent/*`` are its metrics).

    Correct as :func:`judge` says; per function as ``eval/correct/<name>``.
    """
    t = run.cfg.trainer
    params = SamplingParams(
        n=1, temperature=0.0, max_new_tokens=t.eval_max_new_tokens or t.max_new_tokens
    )
    chunk = run.cfg.rollout.generation_batch_size or 256
    completions: list[str] = []
    lengths, truncated = [], []
    agent_metrics: dict[str, float] = {}
    with run.models.actor():
        for start in range(0, len(prompt_ids), chunk):
            if run.agent is not None:  # multi-turn, greedy: the final answers are scored
                idx = list(range(start, min(start + chunk, len(rows))))
                got = agent_rollout(run, [rows[i] for i in idx], idx, params)
                batch, texts_k = got.batch, list(got.completions)
                for key, value in got.metrics.items():  # sample-weighted over the chunks
                    agent_metrics[key] = agent_metrics.get(key, 0.0) + value * len(idx)
            else:
                batch = run.engine.generate(
                    run.models.policy,
                    prompt_ids[start : start + chunk],
                    params,
                    eos_ids=run.eos_ids,
                    pad_id=run.pad_id,
                )
                texts_k = run.decode(batch)
            completions.extend(texts_k)
            lengths.extend(batch.response_mask.sum(1).tolist())
            truncated.extend(batch.truncated.tolist())
    out = run.rewards(rows, texts, completions)
    ok, per_fn = judge(out)
    correct = ok.float()
    return {
        **{f"eval/correct/{name}": value for name, value in per_fn.items()},
        "eval/accuracy": float(correct.mean()),
        "eval/reward": float(out.scores.float().mean()),
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        "eval/truncated": sum(truncated) / max(1, len(truncated)),
        "eval/n": float(len(rows)),
        **{f"eval/{k}": v / max(1, len(rows)) for k, v in agent_metrics.items()},
        "_samples": [
            {
                "prompt": p,
                "completion": _shown(c),
                "ground_truth": r.ground_truth,
                "correct": bool(k),
            }
            for p, c, r, k in zip(texts[:16], completions[:16], rows[:16], correct[:16].tolist())
        ],
    }


def _shown(completion: str) -> str | list:
    """What eval/step_N.json shows: an agent's trajectory (tool turns included), or the text."""
    return completion.messages if isinstance(completion, AgentCompletion) else completion
