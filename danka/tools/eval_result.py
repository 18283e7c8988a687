"""What ``danka eval`` has scored so far, and the result file it keeps up to date.

:class:`Answered` collects each batch's scored answers as soon as they exist (the
evaluation can stop at any batch and still report what it answered, marked ``partial``);
:func:`result_writer` writes the result atomically (the previous version or the new one,
never half), after every batch and at the end.
"""

from __future__ import annotations

import json
from typing import Any

from danka.tools.evaluate import KEEP_SAMPLES, score_samples, summarize


class Answered:
    """The scored answers so far (one entry per prompt, in order) and the summary of them."""

    def __init__(self, rewards: Any, threshold: float, tools: bool, total: int, on_progress):
        self.rewards, self.threshold, self.tools, self.total = rewards, threshold, tools, total
        self.on_progress = on_progress
        self.items: list[tuple[dict, list[float], list[bool]]] = []
        self.per_fn: dict[str, float] = {}  # correct answers per reward function
        self.metrics: dict[str, float] = {}

    def add(self, items: list[dict[str, Any]]) -> None:
        scores, correct, per_fn = score_samples(
            [it["row"] for it in items],
            [it["prompt"] for it in items],
            [it["completions"] for it in items],
            self.rewards,
            self.threshold,
        )
        answers = sum(len(c) for c in correct)
        for name, fraction in per_fn.items():
            self.per_fn[name] = self.per_fn.get(name, 0.0) + fraction * answers
        self.items += list(zip(items, scores, correct))
        if self.on_progress is not None and len(self.items) < self.total:
            self.on_progress(self.result())

    def result(self, stopped: str | None = None) -> dict[str, Any]:
        items = [it for it, _, _ in self.items]
        scores = [s for _, s, _ in self.items]
        correct = [c for _, _, c in self.items]
        result = summarize(correct, [it["response_tokens"] for it in items],
                           [it["truncated"] for it in items], scores)  # fmt: skip
        answers = max(1, sum(len(c) for c in correct))
        result["correct_per_function"] = {k: v / answers for k, v in self.per_fn.items()}
        result.update(self.metrics)
        result["completions"] = [
            {
                "index": it["index"],
                "prompt": it["prompt"],
                "completion": str(it["completions"][0]),
                **({"messages": it["trajectories"][0]} if self.tools else {}),
                "ground_truth": it["row"].ground_truth,
                "reward": s[0],
                "correct": c[0],
            }
            for it, s, c in self.items[:KEEP_SAMPLES]
        ]
        if len(self.items) < self.total:  # says so, in the result and in its file
            result.update(partial=True, answered=len(self.items), prompts=self.total)
        if stopped:
            result["stopped"] = stopped
        return result


def result_writer(output: str | None, header: dict[str, Any]):
    """``write(result)``: ``header`` + ``result``, written atomically to ``output`` (a
    reader sees the previous version or the new one, never half); returns what it wrote.
    UserError now when ``output`` cannot be a file (a folder, a path through a file)."""
    from danka.io import prepare_output_file, write_text_atomic

    path = prepare_output_file(output) if output else None

    def write(result: dict[str, Any]) -> dict[str, Any]:
        full = {**header, **result}
        if path is not None:
            write_text_atomic(path, json.dumps(full, indent=2, ensure_ascii=False))
        return full

    return write
