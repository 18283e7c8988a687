"""When to save by steps: ``checkpoint.save_steps`` (pure).

Default (``save_steps: null``): every 10% of the run, so a crash at step 190 of 200 loses
at most 20 steps; ``save_steps: K`` every K steps; ``save_steps: 0`` only at the end.
The last step always saves. ``checkpoint.save_minutes`` (also save when M minutes have
passed since the last save) is a clock, which every rank must read alike: the run's
clocks own it (danka/trainer/clocks.py).
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


def save_due(step: int, total_steps: int, save_steps: int | None = None) -> bool:
    """True if ``step`` (1-based) is a step the run saves after, by the step count."""
    if step >= total_steps:
        return True
    every = save_interval(total_steps, save_steps)
    return bool(every) and step % every == 0
