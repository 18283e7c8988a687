"""Checking reward specs (names and kwargs) without loading any model or user code.

:func:`check_reward_specs` is what the config validator and ``--print-config`` call: a
builtin name must exist and its kwargs must be parameters of the builtin (each builtin's
signature is its list of options, see builtin.py); a user function must be written as
``path/to/file.py:function`` (its file is not executed here). Errors name the config key,
``reward.functions[i].name`` or ``reward.functions[i].kwargs.KEY``, list the valid names
and suggest the nearest one. Torch-free.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

from danka.errors import UserError
from danka.rewards.builtin import GSM8K_METHODS, REWARDS
from danka.rewards.custom import is_custom_spec
from danka.rewards.names import RESERVED

# Values a builtin's option must take, checked here so that a typo in a value is exit 2
# at start-up instead of an exception per sample (which on_error: zero would hide).
_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {("gsm8k", "method"): GSM8K_METHODS}


_LABEL = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


def builtin_kwargs(name: str) -> list[str]:
    """The keyword options builtin ``name`` accepts (its parameters after completion, row)."""
    params = list(inspect.signature(REWARDS[name]).parameters.values())[2:]
    return [p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]


def _field(spec: Any, key: str, default: Any) -> Any:
    if isinstance(spec, Mapping):
        return spec.get(key, default)
    return getattr(spec, key, default)


def check_reward_spec(name: str, kwargs: Any, where: str) -> None:
    """Check one spec; ``where`` is its config key, e.g. ``reward.functions[0]``."""
    if not isinstance(name, str) or not name:
        raise UserError(
            "reward function without a name",
            where=f"{where}.name",
            fix=f"use a builtin ({', '.join(sorted(REWARDS))}) or path/to/file.py:function",
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise UserError(
            f"kwargs must be a mapping, got {type(kwargs).__name__}",
            where=f"{where}.kwargs",
            fix="write them as `kwargs: {key: value}`",
        )
    if is_custom_spec(name):
        return  # the user's file is loaded (and its signature checked) when training starts
    if name not in REWARDS:
        raise UserError(
            f"unknown reward {name!r}",
            where=f"{where}.name",
            fix=f"{_did_you_mean(name, sorted(REWARDS))}use a builtin "
            f"({', '.join(sorted(REWARDS))}) or your own function as "
            "path/to/file.py:function_name (relative to the config file)",
        )
    valid = builtin_kwargs(name)
    for key, value in kwargs.items():
        if key not in valid:
            raise UserError(
                f"unknown option {key!r} for the builtin reward {name!r}",
                where=f"{where}.kwargs.{key}",
                fix=f"{_did_you_mean(key, valid)}valid options of {name}: "
                f"{', '.join(valid) or 'none'}",
            )
        choices = _CHOICES.get((name, key))
        if choices is not None and value not in choices:
            raise UserError(
                f"{name} {key} must be one of {', '.join(choices)}, got {value!r}",
                where=f"{where}.kwargs.{key}",
                fix=f"{_did_you_mean(str(value), choices)}use one of: {', '.join(choices)}",
            )


def check_reward_specs(specs: Sequence[Any], prefix: str = "reward.functions") -> None:
    """Check every spec (objects with ``name``/``kwargs`` attributes, such as the config's
    ``RewardFunction`` or combine.RewardSpec, or dicts); UserError (exit 2) naming
    ``reward.functions[i].name`` or ``reward.functions[i].kwargs.KEY`` on the first
    problem. Loads no model and runs no user code."""
    for i, spec in enumerate(specs):
        check_reward_spec(_field(spec, "name", None), _field(spec, "kwargs", {}), f"{prefix}[{i}]")
    check_reward_labels(specs, prefix)


def check_reward_labels(specs: Sequence[Any], prefix: str = "reward.functions") -> None:
    """UserError naming ``reward.functions[i].label`` for a label that is no plain name,
    is used twice, or is one of danka's own reward names (danka.rewards.names.RESERVED):
    reward/<label> would overwrite danka's metric. The run doctor reads a run's config
    through this too."""
    labels: set[str] = set()
    for i, spec in enumerate(specs):
        label = _field(spec, "label", None)
        if label is None:
            continue
        if not isinstance(label, str) or not _LABEL.fullmatch(label) or label in labels:
            raise UserError(
                f"reward label {label!r} is "
                + ("used twice" if label in labels else "not a plain name"),
                where=f"{prefix}[{i}].label",
                fix="give each term its own name of letters, digits, '_', '-' or '.' "
                "(e.g. strict, flexible), or leave label out",
            )
        if label in RESERVED:
            raise UserError(
                f"reward label {label!r} is one of danka's own reward metrics: "
                f"reward/{label} would overwrite it",
                where=f"{prefix}[{i}].label",
                fix=f"choose another name; danka logs reward/<name> for {', '.join(RESERVED)}",
            )
        labels.add(label)


# The largest float32 number: training reads the combined reward as float32, where a
# larger sum is inf (and the advantages NaN)
FLOAT32_MAX = 3.4028234663852886e38


def check_reward_weights(
    specs: Sequence[Any], model_weight: float | None = None, prefix: str = "reward.functions"
) -> None:
    """UserError (exit 2) naming the weight at which the sum of the weights' sizes passes
    :data:`FLOAT32_MAX`: then a reward of 1 from every term is not a finite number
    (``model_weight``: the reward model's, where one is set)."""
    weights = [(f"{prefix}[{i}].weight", _field(s, "weight", 1.0)) for i, s in enumerate(specs)]
    if model_weight is not None:
        weights.append(("reward.model_weight", model_weight))
    total = 0.0
    for key, weight in weights:
        total += abs(float(weight))
        if not total <= FLOAT32_MAX:  # NaN too
            shown = ", ".join(f"{w:g}" for _, w in weights)
            raise UserError(
                f"the reward weights add up to more than {FLOAT32_MAX:.1e}, the largest "
                f"float32 number ({shown}): the combined reward would be inf",
                where=key,
                fix="use weights whose sizes add up to a finite number (e.g. 0.1 to 10)",
            )
