"""Small helpers the checks share: a metric's values up to a step (:class:`MetricTable`
keeps a run's metrics as columns so that costs the window, not the run), first-steps
baseline vs trailing window, and number formatting for evidence strings."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any

# The first steps are the base model: in 5 steps LoRA at lr 1e-5..2e-4 has barely moved it,
# and 5 batches average out one batch's noise (a batch is 64-256 samples).
BASELINE_STEPS = 5
# "Now" is the mean or median of the last 5 steps, so one odd batch never triggers a check.
WINDOW = 5


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool, not an integer past
    float's range), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return x if math.isfinite(x) else None


_NON_FINITE = ("inf", "-inf", "nan")  # how metrics.jsonl writes a float it cannot


class MetricTable(Sequence):
    """A run's metrics records as columns: per key, the positions of the records where it
    is a finite number, their steps and those numbers, in arrays (8 bytes each, not a dict
    per step).

    Why: ``danka doctor`` runs every check at every step, and a check reads a metric's
    first and last few points up to that step. Over a list of dicts that is a scan per
    step (quadratic: a 250k-step run never got a verdict) and a dict per step (a 200 MB
    metrics.jsonl took over 1 GB). Here :meth:`points` is a view found by bisection, and
    only numbers are kept (what the checks read). ``table[i]`` rebuilds record ``i`` (its
    ``step`` and numbers); :meth:`append` adds one (the live diagnoser). Numbers that are
    not finite (inf, NaN; metrics.jsonl writes ``"inf"``, ``"-inf"``, ``null``) are kept
    apart, for :meth:`non_finite`: a check that must not read them as numbers can find
    them."""

    def __init__(self, records: Iterable[dict] = ()):
        self._steps: list[Any] = []
        self._cols: dict[str, tuple[array, array, array]] = {}  # positions, steps, values
        self._odd: dict[str, tuple[array, array, array]] = {}  # the same, of inf and NaN
        for record in records:
            self.append(record)

    @staticmethod
    def _add(cols: dict, key: str, i: int, step: int, value: float) -> None:
        col = cols.get(key)
        if col is None:
            col = cols[key] = (array("q"), array("q"), array("d"))
        col[0].append(i)
        col[1].append(step)
        col[2].append(value)

    def append(self, record: dict) -> None:
        i, step = len(self._steps), record.get("step")
        if not (isinstance(step, int) and not isinstance(step, bool) and abs(step) < 2**62):
            step = None  # points then count positions (as the list reader does)
        self._steps.append(step)
        for key, value in record.items():
            kind = type(value)
            if (kind is float and value - value == 0) or (kind is int and abs(value) < 2**62):
                n = len(self._cols[key][0]) if key in self._cols else 0
                self._add(self._cols, key, i, n if step is None else int(step), value)
            elif value is None or kind is float or (kind is str and value in _NON_FINITE):
                self._add(
                    self._odd, key, i, i if step is None else int(step), float(value or "nan")
                )

    def __len__(self) -> int:
        return len(self._steps)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices, IndexError
        out: dict[str, Any] = {}
        for key, (pos, _, vals) in self._cols.items():
            j = bisect_right(pos, i) - 1
            if j >= 0 and pos[j] == i:
                out[key] = vals[j]
        if self._steps[i] is not None:
            out["step"] = self._steps[i]
        return out

    def step_at(self, i: int) -> Any:
        return self._steps[i]

    def points(self, key: str, upto: int, cols: dict | None = None) -> Points:
        col = (self._cols if cols is None else cols).get(key)
        pos, steps, vals = col or (array("q"), array("q"), array("d"))
        return Points(steps, vals, bisect_right(pos, upto))

    def non_finite(self, prefix: str, upto: int) -> list[tuple[str, Points]]:
        """(key, its inf and NaN points up to position ``upto``) of every key that is
        ``prefix`` or starts with ``prefix/``, where it has any."""
        keys = [k for k in self._odd if k == prefix or k.startswith(prefix + "/")]
        found = [(k, self.points(k, upto, self._odd)) for k in keys]
        return [(k, pts) for k, pts in found if len(pts)]


class Points(Sequence):
    """``(step, value)`` pairs of one metric up to a position: what :func:`points` returns
    for a :class:`MetricTable`; indexing and slicing cost what they return."""

    def __init__(self, steps: array, vals: array, n: int):
        self._steps, self._vals, self._n = steps, vals, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            a, b, stride = i.indices(self._n)
            return list(zip(self._steps[a:b:stride], self._vals[a:b:stride]))
        j = range(self._n)[i]
        return self._steps[j], self._vals[j]


def points(records: Sequence[dict], key: str, upto: int) -> Sequence[tuple[int, float]]:
    """(step, value) of ``key`` in ``records[: upto + 1]`` where it is a finite number."""
    if isinstance(records, MetricTable):
        return records.points(key, upto)
    out = []
    for r in records[: upto + 1]:
        v = finite(r.get(key))
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
