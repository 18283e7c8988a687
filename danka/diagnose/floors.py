"""The guess floor of a held-out set: the accuracy of answers no model needs.

For every reward function that scores correctness, three constant policies are scored
exactly as the evaluation scores the model (the same reward computer, the same "score at
least 1.0" rule as ``danka.step.heldout.judge``):

- ``common_answer``: every question answered with the most common ground truth of the set;
- ``last_prompt_number``: each question answered with the last number in its prompt;
- ``empty``: the empty answer.

Each guess is written in every form a builtin correctness reward reads (RENDERS: after
``####`` for gsm8k strict/flexible/lenient and last_number, ``\\boxed{}`` for math, bare),
and the best form counts: a guessing policy would learn that form. ``guess_floor`` is the
highest of the three guesses under the primary (first) function; an accuracy at or below
it is no evidence that the model solves anything.

A function "scores correctness" when it scores the ground truth itself (rendered the same
ways) at least 0.5 more often than a wrong number: gsm8k, math and last_number do; format
and length do not. Reward models are not guessed (pass the rule terms only).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from danka.rewards.builtin import last_number_in

GUESSES = ("common_answer", "last_prompt_number", "empty")
RENDERS = ("#### {}", "\\boxed{{{}}}", "{}")
WRONG_ANSWER = "987654321"  # no generated or GSM8K answer is this number
CORRECTNESS_MARGIN = 0.5
DETECT_ROWS = 64  # correctness is told from the first rows: cheap, and a rule reward is
# either reading the ground truth or not (it does not change from row to row)

# rows, prompts, completions -> an object with ``per_function``: name -> (B,) scores
# (danka.rewards.combine.RewardComputer's call)
Scorer = Callable[[Sequence[Any], Sequence[str], Sequence[str]], Any]


@dataclass(frozen=True)
class Floors:
    """Accuracy of each guess under each function, and the floors derived from it."""

    accuracy: dict[str, dict[str, float]]  # function -> guess -> accuracy (best render)
    correctness: tuple[str, ...]  # functions that score correctness, in reward order
    primary: str | None  # the first function: the one eval/accuracy is judged by
    common_answer: str | None  # the most common ground truth
    n: int  # held-out rows
    best: dict[str, str] = field(default_factory=dict)  # function -> the guess at its floor

    def floor(self, function: str | None = None) -> float:
        """The best guess's accuracy under ``function`` (default: the primary)."""
        name = function or self.primary
        return max(self.accuracy.get(name, {}).values(), default=0.0)

    @property
    def guess_floor(self) -> float:
        return self.floor()

    def metrics(self) -> dict[str, float]:
        """Numbers for ``eval/step_N.json`` and the trackers: ``eval/guess_floor`` (primary),
        ``eval/guess_floor/<fn>`` and ``eval/guess/<guess>/<fn>`` for each function that
        scores correctness (and the primary)."""
        out = {"eval/guess_floor": self.guess_floor}
        for name in self._reported():
            out[f"eval/guess_floor/{name}"] = self.floor(name)
            for guess, acc in self.accuracy[name].items():
                out[f"eval/guess/{guess}/{name}"] = acc
        return out

    def to_json(self) -> dict[str, Any]:
        """What the eval file keeps besides the numbers (the guessed answer, by name)."""
        return {
            "common_answer": self.common_answer,
            "correctness_functions": list(self.correctness),
            "best_guess": {name: self.best[name] for name in self._reported()},
        }

    def _reported(self) -> list[str]:
        names = list(self.correctness)
        if self.primary is not None and self.primary not in names:
            names.insert(0, self.primary)
        return [n for n in names if n in self.accuracy]


def prompt_text(row: Any) -> str:
    """The row's own prompt text: a string, or the last user message of chat messages."""
    prompt = row.prompt
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
    return str(users[-1] if users else (prompt[-1].get("content", "") if prompt else ""))


def most_common_answer(rows: Sequence[Any]) -> str | None:
    """The most common ground truth (stripped; ties: the first seen), None if there is none."""
    answers = [str(r.ground_truth).strip() for r in rows if r.ground_truth is not None]
    return Counter(answers).most_common(1)[0][0] if answers else None


def guess_answers(rows: Sequence[Any]) -> dict[str, list[str]]:
    """guess -> one answer per row (before rendering)."""
    common = most_common_answer(rows) or ""
    return {
        "common_answer": [common] * len(rows),
        "last_prompt_number": [last_number_in(prompt_text(r)) or "" for r in rows],
        "empty": [""] * len(rows),
    }


def _accuracy(scores: Any, threshold: float) -> float:
    values = [float(v) for v in scores]
    return sum(v >= threshold - 1e-6 for v in values) / max(1, len(values))


def _best_render(
    rewards: Scorer,
    rows: Sequence[Any],
    prompts: Sequence[str],
    answers: list[str],
    threshold: float,
) -> dict[str, float]:
    """function -> the best accuracy of ``answers`` over the RENDERS (an empty answer is
    only ever the empty string)."""
    renders = ("{}",) if all(a == "" for a in answers) else RENDERS
    best: dict[str, float] = {}
    for form in renders:
        texts = [form.format(a) if a != "" else "" for a in answers]
        out = rewards(rows, prompts, texts)
        for name, scores in out.per_function.items():
            best[name] = max(best.get(name, 0.0), _accuracy(scores, threshold))
    return best


def correctness_functions(
    rewards: Scorer, rows: Sequence[Any], prompts: Sequence[str], threshold: float = 1.0
) -> tuple[str, ...]:
    """The functions that score the ground truth >= CORRECTNESS_MARGIN more often than a
    wrong number (told from the first DETECT_ROWS rows that have a ground truth)."""
    pick = [i for i, r in enumerate(rows) if r.ground_truth is not None][:DETECT_ROWS]
    if not pick:
        return ()
    sub, sub_prompts = [rows[i] for i in pick], [prompts[i] for i in pick]
    truth = [str(r.ground_truth).strip() for r in sub]
    right = _best_render(rewards, sub, sub_prompts, truth, threshold)
    wrong = _best_render(rewards, sub, sub_prompts, [WRONG_ANSWER] * len(sub), threshold)
    return tuple(n for n in right if right[n] - wrong.get(n, 0.0) >= CORRECTNESS_MARGIN)


def guess_floors(
    rows: Sequence[Any], prompts: Sequence[str], rewards: Scorer, threshold: float = 1.0
) -> Floors:
    """Score the three guesses on held-out ``rows`` (``prompts[i]``: the text the policy
    reads for row i, used in reward error messages) with ``rewards`` (the evaluation's
    reward computer; pass one without a reward model). ``threshold``: the score that
    counts as correct (the evaluation's CORRECT_AT, 1.0)."""
    rows, prompts = list(rows), list(prompts)
    if not rows:
        return Floors(accuracy={}, correctness=(), primary=None, common_answer=None, n=0)
    accuracy: dict[str, dict[str, float]] = {}
    for guess, answers in guess_answers(rows).items():
        for name, acc in _best_render(rewards, rows, prompts, answers, threshold).items():
            accuracy.setdefault(name, {})[guess] = acc
    primary = next(iter(accuracy), None)
    best = {name: max(acc, key=lambda k: acc[k]) for name, acc in accuracy.items()}
    return Floors(
        accuracy=accuracy,
        correctness=correctness_functions(rewards, rows, prompts, threshold),
        primary=primary,
        common_answer=most_common_answer(rows),
        n=len(rows),
        best=best,
    )
