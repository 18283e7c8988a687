"""Held-out evaluation: greedy answers scored by the reward function."""

from __future__ import annotations

import dataclasses

import torch

from danka.agent.rewards import AgentCompletion
from danka.rewards.combine import RewardComputer, RewardOutput
from danka.rollout.base import SamplingParams
from danka.trainer.run import Run
from danka.trainer.sample import SampleContext, sample
from danka.trainer.stages import sampling_context

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


def eval_context(run: Run) -> SampleContext:
    """Greedy sampling of the held-out prompts (eval_max_new_tokens), one answer each,
    ``rollout.generation_batch_size`` (or 256) prompts at a time."""
    t = run.cfg.trainer
    params = SamplingParams(
        n=1, temperature=0.0, max_new_tokens=t.eval_max_new_tokens or t.max_new_tokens
    )
    ctx = sampling_context(run, run.eval, params)
    return dataclasses.replace(ctx, chunk=run.cfg.rollout.generation_batch_size or 256)


@torch.no_grad()
def evaluate(ctx: SampleContext, rewards: RewardComputer) -> dict:
    """Greedy accuracy on the prompts of ``ctx`` (through the agent loop when it has one:
    ``eval/agent/*`` are its metrics). Correct as :func:`judge` says; per function as
    ``eval/correct/<name>``."""
    prompts, n = ctx.prompts, len(ctx.prompts.rows)
    completions, lengths, truncated = [], [], []
    agent_metrics: dict[str, float] = {}
    for start in range(0, n, ctx.chunk):
        idx = list(range(start, min(start + ctx.chunk, n)))
        got = sample(ctx, idx)
        completions.extend(got.completions)
        lengths.extend(got.batch.response_mask.sum(1).tolist())
        truncated.extend(got.batch.truncated.tolist())
        for key, value in got.agent_stats.items():  # sample-weighted over the chunks
            agent_metrics[key] = agent_metrics.get(key, 0.0) + value * len(idx)
    out = rewards(prompts.rows, prompts.texts, completions)
    ok, per_fn = judge(out)
    correct = ok.float()
    return {
        **{f"eval/correct/{name}": value for name, value in per_fn.items()},
        "eval/accuracy": float(correct.mean()),
        "eval/reward": float(out.scores.float().mean()),
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        "eval/truncated": sum(truncated) / max(1, len(truncated)),
        "eval/n": float(n),
        **{f"eval/{k}": v / max(1, n) for k, v in agent_metrics.items()},
        "_samples": [
            {
                "prompt": p,
                "completion": _shown(c),
                "ground_truth": r.ground_truth,
                "correct": bool(k),
            }
            for p, c, r, k in zip(
                prompts.texts[:16], completions[:16], prompts.rows[:16], correct[:16].tolist()
            )
        ],
    }


def _shown(completion: str) -> str | list:
    """What eval/step_N.json shows: an agent's trajectory (tool turns included), or the text."""
    return completion.messages if isinstance(completion, AgentCompletion) else completion
