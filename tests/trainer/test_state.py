"""RunState, the run's one changing record: what a step's result makes of it."""

from __future__ import annotations

import dataclasses

import pytest

from danka.step.guards import TrainingFault
from danka.step.records import StepResult, UpdateStats
from danka.trainer.state import RunState


def result(*, skipped: bool = False, micro: int = 8) -> StepResult:
    """A skipped optimiser step, or a step with nothing to train on (not a fault)."""
    update = UpdateStats(actor=None, critic=None, skipped=True) if skipped else None
    return StepResult(scored=None, rounds=[], prepared=None, update=update, dynamic=None,
                      seconds={}, peaks_gib={}, micro=micro)  # fmt: skip


def test_a_step_moves_on_and_keeps_the_micro_batch_it_ended_at():
    state = RunState(step=3, total=10, micro=8)
    after = state.after(result(micro=4), max_bad_steps=5, out_of_time=False)
    assert after == RunState(step=4, total=10, micro=4, bad_in_a_row=0)
    assert state.step == 3 and not after.done  # the old state is left as it was


def test_bad_steps_count_in_a_row_and_stop_the_run_at_the_limit():
    state = RunState(step=0, total=10, micro=8)
    state = state.after(result(skipped=True), max_bad_steps=3, out_of_time=False)
    state = state.after(result(skipped=True), max_bad_steps=3, out_of_time=False)
    assert state.bad_in_a_row == 2
    good = state.after(result(), max_bad_steps=3, out_of_time=False)
    assert good.bad_in_a_row == 0  # a good step resets the count
    with pytest.raises(TrainingFault, match=r"3 steps in a row .* \(last: step 3\)"):
        state.after(result(skipped=True), max_bad_steps=3, out_of_time=False)


def test_the_time_limit_and_a_signal_make_the_step_just_done_the_last():
    state = RunState(step=4, total=10, micro=8)
    late = state.after(result(), max_bad_steps=5, out_of_time=True)
    assert (late.step, late.total, late.done) == (5, 5, True)
    assert dataclasses.replace(state, step=6).stopped().total == 6
    last = RunState(step=9, total=10, micro=8).after(result(), max_bad_steps=5, out_of_time=True)
    assert (last.total, last.done) == (10, True)  # the last step anyway
