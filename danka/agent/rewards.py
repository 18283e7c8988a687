"""Rewards for tool-using answers: the final answer, plus a small bonus for valid calls.

TRL's batched contract ``fn(prompts, completions, ground_truth, **kw) -> list[float]``.
The turns come from ``messages`` (per sample, the trajectory's messages after the prompt,
tool turns included: what ``danka train`` and ``danka eval`` pass for an agent rollout),
else from a completion that is itself a message list (TRL passes tool-calling completions
this way), else from the decoded response text, split at ``<tool_response>`` blocks.
Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from danka.agent.parse import parse_tool_calls, strip_tool_calls

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# set (True) by the agent loop on an assistant message it cut: no end-of-turn token (the
# per-turn cap or the token budget); the loop never ran that turn's calls
TRUNCATED = "truncated"


def _turns(completion: str | Sequence[dict[str, Any]]) -> list[tuple[str, bool]]:
    """The assistant turns, in order: (text, completed). A decoded text does not say
    whether its last turn was cut: every turn counts as completed there."""
    if isinstance(completion, str):
        return [
            (re.sub(r"<tool_response>.*?</tool_response>", "", part, flags=re.DOTALL), True)
            for part in re.split(r"</tool_response>", completion)
        ]
    return [
        (str(m.get("content", "")), not m.get(TRUNCATED))
        for m in completion
        if m.get("role") == "assistant"
    ]


def final_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed ("1,234" -> "1234")."""
    found = _NUMBER.findall(strip_tool_calls(text))
    return found[-1].replace(",", "") if found else None


def same_number(answer: str | None, truth: str | None) -> bool:
    if answer is None or truth is None:
        return False
    try:
        return abs(float(answer) - float(truth)) < 1e-6
    except ValueError:
        return answer.strip() == truth.strip()


def tool_answer_reward(
    prompts: Sequence[Any],
    completions: Sequence[str | Sequence[dict[str, Any]]],
    ground_truth: Sequence[str | None],
    valid_call_bonus: float = 0.1,
    messages: Sequence[Sequence[dict[str, Any]] | None] | None = None,
    **_columns: Any,
) -> list[float]:
    """1.0 if the final turn's last number equals ``ground_truth``, plus ``valid_call_bonus
    * (well-formed calls / calls)`` when the trajectory made at least one call. Only calls
    in completed turns count: a turn the loop cut (marked ``truncated``) never ran its calls.

    Example: calls ``[ok, malformed]`` and a correct final answer -> 1.0 + 0.1 * 1/2 = 1.05.
    """
    scores = []
    trajectories = messages if messages is not None else [None] * len(completions)
    for completion, truth, turns_of in zip(completions, ground_truth, trajectories):
        turns = _turns(turns_of or completion)
        calls = [c for text, completed in turns if completed for c in parse_tool_calls(text)]
        final = turns[-1][0] if turns else ""
        score = (
            1.0 if not parse_tool_calls(final) and same_number(final_number(final), truth) else 0.0
        )
        if calls:
            score += valid_call_bonus * sum(c.ok for c in calls) / len(calls)
        scores.append(score)
    return scores
