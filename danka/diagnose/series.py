"""Small helpers the checks share: a metric's values up to a step, first-steps baseline
vs trailing window, and number formatting for evidence strings."""

from __future__ import annotations

import math
from typing import Any

# The first steps are the base model: in 5 steps LoRA at lr 1e-5..2e-4 has barely moved it,
# and 5 batches average out one batch's noise (a batch is 64-256 samples).
BASELINE_STEPS = 5
# "Now" is the mean or median of the last 5 steps, so one odd batch never triggers a check.
WINDOW = 5


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def points(records: list[dict], key: str, upto: int) -> list[tuple[int, float]]:
    """(step, value) of ``key`` in ``records[: upto + 1]`` where it is a finite number."""
    out = []
    for r in records[: upto + 1]:
        v = _number(r.get(key))
        if v is not None:
            out.append((int(r.get("step", len(out))), v))
    return out


def first_and_last(
    pts: list[tuple[int, float]], first: int = BASELINE_STEPS, last: int = WINDOW
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]] | None:
    """(the first ``first`` points, the last ``last``), not overlapping; None if too few."""
    if len(pts) < first + last:
        return None
    return pts[:first], pts[-last:]


def median(pts: list[tuple[int, float]]) -> float:
    xs = sorted(v for _, v in pts)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def mean(pts: list[tuple[int, float]]) -> float:
    return sum(v for _, v in pts) / len(pts)


def span(pts: list[tuple[int, float]]) -> str:
    """``steps 3-7`` (or ``step 3``)."""
    a, b = pts[0][0], pts[-1][0]
    return f"step {a}" if a == b else f"steps {a}-{b}"


def g(x: float) -> str:
    """A number for a message: 3 significant digits."""
    return f"{x:.3g}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
