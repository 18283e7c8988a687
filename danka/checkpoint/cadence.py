"""When to save: ``checkpoint.save_steps`` / ``checkpoint.save_minutes`` (pure, the loop calls it).

Default (``save_steps: null``): every 10% of the run, so a crash at step 190 of 200 loses
at most 20 steps; ``save_steps: K`` every K steps; ``save_steps: 0`` only at the end.
``save_minutes: M`` also saves when M minutes have passed since the last save (long steps
on a slow card). The last step always saves.
"""

from __future__ import annotations

import math

DEFAULT_FRACTION = 0.1  # save_steps: null = every 10% of the run


def save_interval(total_steps: int, save_steps: int | None) -> int:
    """Steps between saves (0 = only at the end). ``save_steps=None`` -> ceil(10% of
    total_steps), at least 1: 200 steps -> 20, 25 -> 3, 5 -> 1."""
    if save_steps is None:
        return max(1, math.ceil(total_steps * DEFAULT_FRACTION))
    return save_steps


def save_due(
    step: int,
    total_steps: int,
    save_steps: int | None = None,
    save_minutes: float | None = None,
    minutes_since_save: float = 0.0,
) -> bool:
    """True if the loop should write a checkpoint after ``step`` (1-based)."""
    if step >= total_steps:
        return True
    every = save_interval(total_steps, save_steps)
    if every and step % every == 0:
        return True
    return save_minutes is not None and minutes_since_save >= save_minutes
