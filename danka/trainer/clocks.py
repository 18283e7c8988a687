"""The run's cadences in one owner: when to evaluate (``eval.every_steps`` /
``eval.every_minutes``), when to save (``checkpoint.save_steps`` / ``save_minutes``) and
when to stop (``trainer.max_train_minutes``).

Under torchrun each rank reads its own clock and reaches each line of the loop at its own
moment: rank 0 alone writes a checkpoint's files and an evaluation's, so it finishes them
later than the others. A decision each rank took on its own clock could send one rank
alone into a collective (the checkpoint's state gather, an evaluation's generation), where
it waits for the others forever. So :meth:`RunClocks.after_step` asks every rank once per
step (one collective; a clock due on any rank is due on all), and :meth:`RunClocks.evaluated`
and :meth:`RunClocks.saved` restart that clock on every rank at the same moment (after a
barrier: once the slowest rank is done). The step counts need no agreement; they are
decided here too, so the loop asks one owner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from danka import distributed as dist
from danka.checkpoint.cadence import save_due
from danka.schema.sections import DankaConfig


@dataclass(frozen=True)
class Due:
    """What the loop does after a step; the same on every rank."""

    out_of_time: bool  # trainer.max_train_minutes passed: this step is the last one
    evaluate: bool  # eval.every_steps / every_minutes (the last step's evaluation: the loop's)
    save: bool  # checkpoint.save_steps / save_minutes, or the last step


class RunClocks:
    """The minutes since training started, since the last evaluation and since the last
    save (``now``: a monotonic clock in seconds; tests pass their own)."""

    def __init__(self, cfg: DankaConfig, log: logging.Logger, now: Callable[[], float]):
        self.eval_steps, self.eval_minutes = cfg.eval.every_steps, cfg.eval.every_minutes
        self.save_steps, self.save_minutes = cfg.checkpoint.save_steps, cfg.checkpoint.save_minutes
        self.limit = cfg.trainer.max_train_minutes
        self.log, self.now = log, now
        self.started = self.last_eval = self.last_save = now()

    @classmethod
    def start(
        cls, cfg: DankaConfig, log: logging.Logger, now: Callable[[], float] = time.perf_counter
    ) -> RunClocks:
        """Every clock starts now, at the same moment on every rank (training begins)."""
        dist.barrier()
        return cls(cfg, log, now)

    def _minutes(self, since: float) -> float:
        return (self.now() - since) / 60

    def after_step(self, step: int, total: int) -> Due:
        """The decisions after ``step`` (1-based) of ``total``, agreed by every rank."""
        late = self.limit is not None and self._minutes(self.started) >= self.limit
        evaluate = bool(self.eval_minutes) and self._minutes(self.last_eval) >= self.eval_minutes
        save = self.save_minutes is not None and self._minutes(self.last_save) >= self.save_minutes
        late, evaluate, save = (x > 0 for x in dist.all_sum_many([late, evaluate, save]))
        if late and step < total:
            self.log.info(f"trainer.max_train_minutes ({self.limit}) reached at step {step}")
        last = step >= total or late
        every = bool(self.eval_steps) and step % self.eval_steps == 0
        return Due(
            out_of_time=late,
            evaluate=evaluate or every,
            save=last or save or save_due(step, total, self.save_steps),
        )

    def evaluated(self) -> None:
        """An evaluation ended (on every rank): its clock restarts, the same on all."""
        dist.barrier()
        self.last_eval = self.now()

    def saved(self) -> None:
        """A checkpoint was written (rank 0) and gathered (all): its clock restarts, the
        same on all."""
        dist.barrier()
        self.last_save = self.now()
