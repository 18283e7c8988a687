"""The one "correct" rule, shared by ``danka eval`` and the trainer's held-out evaluation:
a sample is correct when the FIRST reward function scores it at least ``threshold``
(1.0, the score of a right answer for every builtin rule reward)."""

from __future__ import annotations

from typing import Any

import torch

from danka.rewards.combine import RewardOutput
from danka.types import PromptRow

CORRECT_AT = 1.0  # the score of a right answer for every builtin rule reward


def judge(
    out: RewardOutput, threshold: float = CORRECT_AT
) -> tuple[torch.Tensor, dict[str, float]]:
    """(correct (B,) bool: the first reward function's score >= ``threshold``, or the
    combined score if there is no function; per-function accuracy ``name -> fraction``: a
    weight-0 function is a pure metric, e.g. GSM8K's flexible accuracy next to the
    strict one)."""
    primary = next(iter(out.per_function.values())) if out.per_function else out.scores
    correct = primary.float() >= threshold - 1e-6
    per_fn = {
        name: float((v.float() >= threshold - 1e-6).float().mean())
        for name, v in out.per_function.items()
    }
    return correct.cpu(), per_fn


def score_samples(
    rows: list[PromptRow],
    prompts: list[str],
    completions: list[list[str]],
    rewards: Any,
    threshold: float = CORRECT_AT,
    messages: list[list[Any]] | None = None,
) -> tuple[list[list[float]], list[list[bool]], dict[str, float]]:
    """Rewards and correctness of ``completions[i][j]`` (answer j to row i), and the
    fraction of answers each reward function alone scores as correct. ``rewards`` is a
    :class:`danka.rewards.combine.RewardComputer`; ``messages[i][j]``: answer j's turns
    after the prompt, for an agent's answers (as in training)."""
    flat_rows = [r for r, cs in zip(rows, completions) for _ in cs]
    flat_prompts = [p for p, cs in zip(prompts, completions) for _ in cs]
    flat = [c for cs in completions for c in cs]
    turns = {} if messages is None else {"messages": [m for ms in messages for m in ms]}
    out = rewards(flat_rows, flat_prompts, flat, **turns)
    correct, per_fn = judge(out, threshold)
    scores, ok = out.scores.float().tolist(), correct.tolist()
    by_row_s, by_row_c, k = [], [], 0
    for cs in completions:
        by_row_s.append(scores[k : k + len(cs)])
        by_row_c.append([bool(x) for x in ok[k : k + len(cs)]])
        k += len(cs)
    return by_row_s, by_row_c, per_fn
