"""Combining reward functions (and an optional reward model) into one score per sample.

    score_i = sum_k w_k * r_k(completion_i, row_i) + w_rm * rm(prompt_i, completion_i)

The reward model reads prompt_i as the policy read it: the row's prompt with
``data.system_prompt``, ``data.instruction`` and ``data.examples`` applied (as chat
messages, which it renders with its own tokenizer's chat template), so that an RM trained by ``danka rm`` on pairs
whose prompt carries the instruction scores the same text at RL time.

Each r_k is a builtin rule reward or a user function (``file.py:function``), called
through guard.py (timeouts, on_error). Whatever the functions return (python numbers,
numpy, CPU or CUDA tensors, bools) is converted to floats first, and the result tensors
are built on the requested device and dtype, so device mismatches cannot happen here.

None from a TRL-style function means "does not apply to this sample" (TRL's GRPOTrainer
semantics): that term is left out of the sample's sum, the others still count. When NO
term applies to a sample (every function returned None, and there is no reward model)
its score is 0.0 and a warning is logged, as TRL does (``nansum`` of an all-NaN row is 0,
plus a warning). ``reward.on_error`` is not involved (see guard.py); ``valid`` stays True.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from danka.data.template import build_messages
from danka.errors import UserError
from danka.rewards.builtin import REWARDS, default_reward_for
from danka.rewards.custom import CustomReward, is_custom_spec, load_reward_function
from danka.rewards.guard import GuardedReward, RewardFunctionError
from danka.rewards.names import RESERVED, REWARD_MODEL, unique_name
from danka.rewards.specs import check_reward_spec
from danka.schema.sections import DankaConfig
from danka.types import PromptRow

log = logging.getLogger("danka.rewards")

RewardModel = Callable[[Sequence[Any], Sequence[str]], Any]


@dataclass
class RewardSpec:
    """One term of the reward sum (one entry of the config's ``rewards:`` list)."""

    name: str  # builtin name (gsm8k, math, format, length, last_number) or "path.py:function"
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the function
    label: str | None = None  # logged name (reward/<label>); None: the function's name


@dataclass
class RewardOutput:
    """Rewards of one batch. Shapes: B = number of completions."""

    scores: torch.Tensor  # (B,) weighted sum, on the requested device/dtype
    per_function: dict[str, torch.Tensor]  # name -> (B,) UNweighted scores, for logging
    valid: torch.Tensor  # (B,) bool, False where on_error == "skip_sample" dropped a sample
    num_errors: int  # (function, sample) pairs that errored (exception/timeout/None/NaN)
    num_calls: int = 0  # (function, sample) pairs scored, the denominator of error_rate
    # name -> (B,) bool, False where a TRL-style function returned None (not applicable;
    # per_function holds 0.0 there): average per_function over it for a TRL-like nanmean
    applicable: dict[str, torch.Tensor] = field(default_factory=dict)
    num_not_applicable: int = 0  # samples to which NO term applied (score 0, warned)

    @property
    def error_rate(self) -> float:
        """For ``reward/error_rate``: num_errors / num_calls."""
        return self.num_errors / self.num_calls if self.num_calls else 0.0


def _plausible_completion(row: PromptRow) -> str:
    answer = row.ground_truth if row.ground_truth is not None else "42"
    return f"The answer is {answer}.\n#### {answer}"


def _text_prompt(row: PromptRow) -> str:
    return row.prompt if isinstance(row.prompt, str) else str(row.prompt[-1].get("content", ""))


class RewardComputer:
    """Calls every reward term on a batch and sums them; build with
    :func:`build_reward_computer`. Call :meth:`close` (or use ``with``) to stop workers."""

    def __init__(
        self,
        terms: list[tuple[str, float, GuardedReward]],
        reward_model: RewardModel | None = None,
        reward_model_weight: float = 1.0,
        *,
        system_prompt: str | None = None,
        instruction: str | None = None,
        examples: Sequence[Mapping[str, str]] = (),
    ):
        self.terms = terms
        self.reward_model, self.reward_model_weight = reward_model, float(reward_model_weight)
        self.system_prompt, self.instruction = system_prompt, instruction
        self.examples = examples

    def reward_model_prompt(self, row: PromptRow) -> Any:
        """The prompt the reward model reads for ``row``: the policy's (``data.system_prompt``,
        ``data.instruction`` and ``data.examples`` applied, as chat messages); the row's own
        when none is set."""
        if not (self.system_prompt or self.instruction or self.examples):
            return row.prompt
        return build_messages(
            row.prompt,
            system_prompt=self.system_prompt,
            instruction=self.instruction,
            examples=self.examples,
        )

    @property
    def names(self) -> list[str]:
        """Keys of ``RewardOutput.per_function``, in order."""
        return [n for n, _, _ in self.terms] + ([REWARD_MODEL] if self.reward_model else [])

    def __call__(
        self,
        rows: Sequence[PromptRow],
        prompts: Sequence[str],
        completions: Sequence[str],
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        completion_ids: Sequence[Sequence[int]] | None = None,
        messages: Sequence[Any] | None = None,
    ) -> RewardOutput:
        """Rewards for B completions; ``rows[i]``/``prompts[i]`` belong to completion i
        (rows repeat for the n samples of a prompt). ``prompts`` (the text the policy saw)
        is used in error messages; ``completion_ids`` is passed to TRL-style functions;
        ``messages``: an agent rollout's messages after the prompt, per sample (a builtin
        reads ``row.messages``, a TRL-style function gets the ``messages`` column)."""
        b = len(completions)
        if not (len(rows) == len(prompts) == b):
            raise ValueError(
                f"rows ({len(rows)}), prompts ({len(prompts)}), completions ({b}) differ"
            )
        device = torch.device(device) if device is not None else torch.device("cpu")
        scores = torch.zeros(b, dtype=torch.float64)
        valid = torch.ones(b, dtype=torch.bool)
        per_function: dict[str, torch.Tensor] = {}
        applicable: dict[str, torch.Tensor] = {}
        any_applies = torch.zeros(b, dtype=torch.bool)
        errors = 0
        for name, weight, fn in self.terms:
            got = fn(rows, prompts, completions, completion_ids, messages)
            values = torch.tensor(got.values, dtype=torch.float64)  # python floats only
            applies = torch.tensor(got.applies or [True] * b, dtype=torch.bool)
            scores += weight * torch.where(applies, values, 0.0)  # TRL's nansum
            any_applies |= applies
            valid &= torch.tensor(got.valid, dtype=torch.bool)
            errors += got.num_errors
            per_function[name] = values.to(device=device, dtype=dtype)
            applicable[name] = applies.to(device)
        if self.reward_model is not None:
            rm = self.reward_model([self.reward_model_prompt(r) for r in rows], list(completions))
            rm = torch.as_tensor(rm).detach().to(device="cpu", dtype=torch.float64).reshape(-1)
            if rm.numel() != b:
                raise ValueError(f"reward model returned {rm.numel()} scores for {b} completions")
            scores += self.reward_model_weight * rm
            per_function[REWARD_MODEL] = rm.to(device=device, dtype=dtype)
            any_applies[:] = True
        final = scores.to(dtype=dtype)
        if not torch.isfinite(final).all():  # weights x scores past the dtype's range
            raise self._not_finite(
                int((~torch.isfinite(final)).nonzero()[0]), rows, per_function, dtype
            )
        none_apply = ~any_applies
        if self.terms and none_apply.any():
            first = int(none_apply.nonzero()[0])
            log.warning(
                f"every reward function returned None for {int(none_apply.sum())} of {b} "
                f"completions (e.g. completion {first}, data row {rows[first].index}): their "
                "reward is 0; make sure at least one function returns a number for each sample"
            )
        return RewardOutput(
            scores=final.to(device),
            per_function=per_function,
            valid=valid.to(device),
            num_errors=errors,
            num_calls=b * len(self.terms),
            applicable=applicable,
            num_not_applicable=int(none_apply.sum()) if self.terms else 0,
        )

    def _not_finite(self, i: int, rows, per_function: dict, dtype: torch.dtype) -> UserError:
        """Completion ``i``'s combined score is no finite ``dtype`` number: the error names
        each term's weight x score and the weight whose term took the sum past the range."""
        weights = [
            (n, w, f"reward.functions[{k}].weight") for k, (n, w, _) in enumerate(self.terms)
        ]
        if REWARD_MODEL in per_function:
            weights.append((REWARD_MODEL, self.reward_model_weight, "reward.model_weight"))
        running, where, shown = 0.0, None, []
        for name, weight, key in weights:
            value = float(per_function[name][i])
            shown.append(f"{name}: {weight:g} x {value:g}")
            running += weight * value
            if where is None and not torch.isfinite(torch.tensor(running, dtype=dtype)):
                where = key  # the first term past the range
        return UserError(
            f"the combined reward of completion {i} (data row {rows[i].index}) is not a finite "
            f"{str(dtype).removeprefix('torch.')} number: {'; '.join(shown)}",
            where=where,
            fix="lower the weights, or make the reward functions return smaller numbers "
            "(rewards are usually between -1 and 1); resume with --resume auto",
        )

    def check(self, rows: Sequence[PromptRow], n: int = 2) -> None:
        """Run every function on the first ``n`` rows with a plausible completion
        ("The answer is X.\\n#### X", X = ground truth) before training; UserError on a
        crash, a timeout or a wrong return type (None/NaN are judged at training time by
        on_error, since they may depend on the completion)."""
        rows = list(rows)[:n]
        if not rows:
            return
        completions = [_plausible_completion(r) for r in rows]
        prompts = [_text_prompt(r) for r in rows]
        for name, _, fn in self.terms:
            for i, (_value, error) in enumerate(fn.outcomes(rows, completions)):
                if error is not None:
                    err = fn.error(i, rows[i], prompts[i], completions[i], error)
                    raise RewardFunctionError(
                        f"checking reward {name!r} before training: {err.what}",
                        where=err.where,
                        fix="fix the function; it must accept the arguments shown in "
                        "danka/rewards/custom.py's docstring and return a number "
                        "(verl) or a list of numbers (TRL)",
                    )

    def close(self) -> None:
        """Stop the worker processes of user functions."""
        for _, _, fn in self.terms:
            fn.close()

    def __enter__(self) -> RewardComputer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def reward_specs(cfg: DankaConfig, rows: list[PromptRow]) -> list[RewardSpec]:
    """The config's reward functions, or without any (and no reward model) the builtin
    rule for the rows' data source; UserError when there is none."""
    specs = [
        RewardSpec(name=f.name, weight=f.weight, kwargs=dict(f.kwargs), label=f.label)
        for f in cfg.reward.functions
    ]
    if specs or cfg.model.reward_model_name_or_path:
        return specs
    source = rows[0].data_source if rows else "unknown"
    default = default_reward_for(source)
    if default is None:
        raise UserError(
            f"no reward configured, and data source {source!r} has no builtin rule reward",
            where="reward.functions",
            fix="add reward.functions: [{name: gsm8k}] (or math, last_number, path.py:function), "
            "or set model.reward_model_name_or_path",
        )
    return [RewardSpec(name=default)]


def build_reward_computer(
    specs: list[RewardSpec],
    *,
    base_dir: Path,
    timeout_s: float = 30.0,
    on_error: str = "fail",
    reward_model: RewardModel | None = None,
    reward_model_weight: float = 1.0,
    system_prompt: str | None = None,
    instruction: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
) -> RewardComputer:
    """Resolve every spec (builtin name or ``file.py:function`` relative to ``base_dir``,
    the config file's folder) and wrap it in a :class:`GuardedReward`. ``system_prompt``,
    ``instruction`` and ``examples`` (``data.*``) make the reward model's prompts the policy's. UserError for an
    unknown builtin or builtin option (see specs.check_reward_specs), a bad
    file/function, or nothing to compute."""
    if not specs and reward_model is None:
        raise UserError(
            "no reward: the rewards list is empty and there is no reward model",
            fix="add e.g. `rewards: [{name: gsm8k}]`, or a reward model",
        )
    terms: list[tuple[str, float, GuardedReward]] = []
    taken = set(RESERVED)  # a function named like one of danka's metrics gets _2
    for k, spec in enumerate(specs):
        where = f"reward.functions[{k}]"
        check_reward_spec(spec.name, spec.kwargs, where)
        fn: Callable[..., float] | CustomReward
        if is_custom_spec(spec.name):
            fn = load_reward_function(spec.name, base_dir, timeout_s=timeout_s)
            short = fn.function
        else:
            fn, short = REWARDS[spec.name], spec.name
        try:
            weight = float(spec.weight)
        except (TypeError, ValueError):
            raise UserError(
                f"reward weight {spec.weight!r} is not a number", where=f"{where}.weight"
            ) from None
        guarded = GuardedReward(short, fn, spec.kwargs, timeout_s=timeout_s, on_error=on_error)
        terms.append((unique_name(spec.label or short, taken), weight, guarded))
    return RewardComputer(
        terms,
        reward_model,
        reward_model_weight,
        system_prompt=system_prompt,
        instruction=instruction,
        examples=examples,
    )
