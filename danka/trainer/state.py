"""What changes while a run goes: one frozen record, owned by ``fit``'s loop and passed
explicitly. The validated config never changes, and nothing built from it holds this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from danka.step.guards import TrainingFault
from danka.step.records import StepResult


@dataclass(frozen=True)
class RunState:
    step: int  # the last step done (0 before the first; a checkpoint's step on a resume)
    total: int  # the last step to run (trainer.max_train_minutes or a signal may lower it)
    micro: int  # sequences per forward/backward (an out-of-memory retry halves it)
    bad_in_a_row: int = 0  # steps in a row with a skipped optimiser step or non-finite loss

    @property
    def next_step(self) -> int:
        return self.step + 1

    @property
    def done(self) -> bool:
        return self.step >= self.total

    def after(self, result: StepResult, *, max_bad_steps: int, out_of_time: bool) -> RunState:
        """The state once step :attr:`next_step` gave ``result``: the micro-batch it ended
        at (its retries may have halved it), its bad-step count (``max_bad_steps`` in a
        row: TrainingFault, exit 3), and with ``out_of_time`` (trainer.max_train_minutes)
        this step as the last one."""
        step = self.next_step
        bad = 0 if result.finite else self.bad_in_a_row + 1
        if bad >= max_bad_steps:
            raise TrainingFault(
                f"{bad} steps in a row had a non-finite loss or gradient (last: step {step})",
                where="training",
                fix="lower optim.lr, set optim.max_grad_norm, use bfloat16 instead of "
                "float16, or check the reward for inf values; resume with --resume auto "
                "from the last good checkpoint",
            )
        total = step if out_of_time and step < self.total else self.total
        return RunState(step=step, total=total, micro=result.micro, bad_in_a_row=bad)

    def stopped(self) -> RunState:
        """A signal stopped the run: the step just done is the last one."""
        return dataclasses.replace(self, total=self.step)
