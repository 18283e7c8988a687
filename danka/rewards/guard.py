"""Calling reward functions safely: timeouts, crashes, NaN, None, and the on_error policy.

Every reward function, builtin or user, runs in its own worker process (worker.py):
a call over ``timeout_s`` kills the worker and everything it started, and a fresh worker
serves the remaining samples; the worker never outlives the trainer.

on_error applies to exceptions, timeouts, bad return types, NaN and +-inf; and to None
from a per-sample (verl-style) function or a builtin, which must return a number:
  "fail" (default): raise RewardFunctionError (a UserError) showing the sample, the
  function and the traceback; "zero": score 0.0; "skip_sample": score 0.0 and the
  sample is marked invalid (the trainer drops it from the update).

None from a TRL-style (batched) function is NOT an error: as in TRL's GRPOTrainer it
means "this function does not apply to this sample". The sample's entry is marked not
applicable (``GuardedScores.applies``) and the function adds nothing to that sample's
weighted sum (TRL: NaN, then ``nansum``); see combine.py for a sample no function
applies to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from danka.errors import UserError
from danka.rewards.custom import CustomReward, problem_with, trl_call_args, verl_call_args
from danka.usercode.worker import Target, Worker

if TYPE_CHECKING:
    from danka.types import PromptRow

ON_ERROR = ("fail", "zero", "skip_sample")

# An outcome per sample: (value, error). error is None when the call itself succeeded
# (value may still be None/NaN, which the policy judges), else the reason it failed.
Outcome = tuple["float | None", "str | None"]


class RewardFunctionError(UserError):
    """A reward function failed on a sample and on_error is "fail"."""


@dataclass
class GuardedScores:
    """What one reward function gave a batch after the on_error policy. Shapes: B."""

    values: list[float]  # finite scores; 0.0 where an error was replaced or not applicable
    valid: list[bool]  # False where on_error == "skip_sample" dropped the sample
    num_errors: int  # samples with an exception, timeout, bad type or NaN (or verl None)
    # False where a TRL-style function returned None ("does not apply to this sample")
    applies: list[bool] = field(default_factory=list)


def _clip(text: Any, n: int) -> str:
    text = str(text)
    return repr(text if len(text) <= n else text[:n] + f"... [{len(text) - n} more chars]")


def _builtin_name(fn: Callable[..., Any]) -> str:
    from danka.rewards.builtin import REWARDS

    for name, registered in REWARDS.items():
        if registered is fn:
            return name
    raise ValueError(
        f"{getattr(fn, '__qualname__', fn)!r} is not a registered builtin reward: register it "
        "with @register_reward(name) in danka/rewards/builtin.py, or load a user function "
        "with load_reward_function (the worker process must be able to find it)"
    )


def _adopt(fn: Any, target: Target, timeout_s: float) -> Worker:
    """The worker that loaded a CustomReward (its first user takes it over: the file is not
    imported again), else a new one, started on the first call."""
    worker = getattr(fn, "worker", None)
    if isinstance(worker, Worker) and not worker.adopted:
        worker.adopted = True
        worker.timeout_s = float(timeout_s)
        return worker
    return Worker(target, timeout_s)


def _row_fields(row: PromptRow, messages: Any = None) -> dict[str, Any]:
    # What a builtin may read from its row, as plain data (PromptRow imports torch), and
    # an agent rollout's messages after the prompt (None single-turn)
    return {
        "ground_truth": row.ground_truth,
        "data_source": row.data_source,
        "index": row.index,
        "messages": messages,
    }


class GuardedReward:
    """One reward function (a registered builtin ``fn(completion, row, **kw)``, or a
    :class:`CustomReward`) run in its worker process, plus its kwargs and error policy.

    ``timeout_s`` bounds ONE call: one sample for builtins and verl-style functions, the
    whole batch for TRL-style (batched) ones, whose failure then counts for every sample."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., float] | CustomReward,
        kwargs: dict[str, Any] | None = None,
        *,
        timeout_s: float = 30.0,
        on_error: str = "fail",
    ):
        if on_error not in ON_ERROR:
            raise UserError(
                f"unknown on_error {on_error!r}", fix=f"use one of: {', '.join(ON_ERROR)}"
            )
        if not 0 < timeout_s < float("inf"):  # NaN too
            raise UserError(f"reward timeout must be > 0 s, got {timeout_s}")
        self.name, self.fn, self.kwargs = name, fn, dict(kwargs or {})
        self.on_error = on_error
        if isinstance(fn, CustomReward):
            self.kind: str = fn.kind
            self.where = fn.spec
            target = Target(str(fn.path), fn.function, fn.kind, fn.spec)
        else:
            builtin = _builtin_name(fn)
            self.kind, self.where = "builtin", f"builtin reward {builtin!r}"
            target = Target("", builtin, "builtin", self.where)
        self._worker = _adopt(fn, target, timeout_s)

    def outcomes(
        self,
        rows: Sequence[PromptRow],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
        messages: Sequence[Any] | None = None,
    ) -> list[Outcome]:
        """(value, error) per sample, before the on_error policy. ``messages``: an agent
        rollout's messages after the prompt, per sample (builtins read ``row.messages``,
        TRL-style functions get a ``messages`` column)."""
        if self.kind == "builtin":
            per = messages if messages is not None else [None] * len(completions)
            calls = [
                {"completion": c, "row": _row_fields(r, m)}
                for c, r, m in zip(completions, rows, per)
            ]
            return self._worker.run(calls, self.kwargs)
        if self.kind == "verl":
            calls = [verl_call_args(r, c) for r, c in zip(rows, completions)]
            return self._worker.run(calls, self.kwargs)
        args = trl_call_args(rows, completions, completion_ids)
        if messages is not None:
            args["messages"] = [list(m) if m is not None else None for m in messages]
        [(values, error)] = self._worker.run([args], self.kwargs)
        if error is not None:  # one batched call failed: every sample shares the error
            return [(None, error)] * len(completions)
        return [(v, None) for v in values]

    def __call__(
        self,
        rows: Sequence[PromptRow],
        prompts: Sequence[str],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
        messages: Sequence[Any] | None = None,
    ) -> GuardedScores:
        """Scores of one batch under the on_error policy (see the module docstring)."""
        values: list[float] = []
        valid: list[bool] = []
        applies: list[bool] = []
        errors = 0
        for i, (value, error) in enumerate(
            self.outcomes(rows, completions, completion_ids, messages)
        ):
            if error is None and value is None and self.kind == "trl":
                values.append(0.0)  # TRL: None = not applicable, left out of the sum
                valid.append(True)
                applies.append(False)
                continue
            applies.append(True)
            reason = error or problem_with(value)
            if reason is None:
                values.append(float(value))  # type: ignore[arg-type]
                valid.append(True)
                continue
            errors += 1
            if self.on_error == "fail":
                raise self.error(i, rows[i], prompts[i], completions[i], reason)
            values.append(0.0)
            valid.append(self.on_error != "skip_sample")
        return GuardedScores(values=values, valid=valid, num_errors=errors, applies=applies)

    def error(
        self, i: int, row: PromptRow, prompt: str, completion: str, reason: str
    ) -> RewardFunctionError:
        """The error shown when this function fails on sample ``i``."""
        lines = reason.strip().splitlines()
        shown = "\n    ".join(lines[-12:])
        hint = ""
        if reason == "returned None" and self.kind == "verl":
            hint = (
                " (None means 'not applicable' only for batched TRL-style functions; a verl "
                "compute_score must return a number)"
            )
        return RewardFunctionError(
            f"reward function {self.name!r} failed on completion {i} (data row {row.index}):\n"
            f"    {shown}\n"
            f"  prompt:     {_clip(prompt, 200)}\n"
            f"  completion: {_clip(completion, 300)}",
            where=self.where,
            fix="make the function return a finite number for every completion, or set "
            "reward.on_error to zero (score 0) or skip_sample (drop the sample)" + hint,
        )

    def close(self) -> None:
        self._worker.close()
