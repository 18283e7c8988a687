"""Validation, once before any model loads: the values each key may take, the derived
values (danka/config/resolve.py), then one check per section (danka/config/checks.py);
and :func:`freeze`, after which the config is read-only."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Protocol

from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
from danka.algorithms.kl import KL_ESTIMATORS, KL_MODES
from danka.algorithms.losses import AGG_MODES, POLICY_LOSSES
from danka.algorithms.presets import ALGORITHMS
from danka.algorithms.rollout_correction import ROLLOUT_CORRECTIONS
from danka.config.checks import CHECKS
from danka.config.resolve import resolve
from danka.data.tasks import TASKS
from danka.errors import UserError
from danka.rollout.base import LORA_COMPUTE, ROLLOUT_ENGINES
from danka.schema.dtypes import canonical_dtype
from danka.schema.sections import DankaConfig


class ConfigSource(Protocol):
    """Where config values came from (config.load's _Source)."""

    explicit: set[str]  # dotted keys the user set (file or override)

    def where(self, key: str) -> str: ...


def choices() -> dict[str, set]:
    """Valid values per key: names from the registries, the rest fixed here."""
    return {
        "model.torch_dtype": {"auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"},
        "model.reward_model_type": {"auto", "classifier", "judge"},
        "model.tokenizer_kwargs.padding_side": {"left", "right"},
        "trainer.algorithm": set(ALGORITHMS.names()),
        "trainer.advantage_estimator": {None, *ADVANTAGE_ESTIMATORS.names()},
        "loss.policy_loss": set(POLICY_LOSSES.names()),
        "loss.agg_mode": set(AGG_MODES),
        "optim.lr_scheduler": {"constant", "cosine", "linear"},
        "loss.kl.estimator": set(KL_ESTIMATORS.names()),
        "loss.kl.mode": set(KL_MODES.names()),
        "trainer.rollout_correction.mode": set(ROLLOUT_CORRECTIONS.names()),
        "rollout.engine": {"auto", *ROLLOUT_ENGINES.names()},
        "data.format": {"auto", "seed", "trl", "verl", "gsm8k"},
        "data.overlong_prompt": {"error", "drop", "truncate_left"},
        "data.on_bad_row": {"error", "skip"},
        "data.task": {None, *TASKS.names()},
        "reward.on_error": {"fail", "zero", "skip_sample"},
        "backend.fsdp.sharding": {"auto", "shard", "replicate"},
        "agent.tool_sandbox": {"auto", "bwrap", "namespaces", "none"},
        "rollout.lora_compute": set(LORA_COMPUTE),
    }


def _get(cfg: DankaConfig, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class At:
    """Where a key was written (``at.where(key)``), and the checks' ways to refuse it."""

    source: ConfigSource | None = None

    def where(self, key: str) -> str:
        return self.source.where(key) if self.source else f"config key {key}"

    def fail(self, key: str, what: str, fix: str) -> None:
        raise UserError(what, where=self.where(key), fix=fix)

    def size_or_auto(self, key: str, value, minimum: int, example: str) -> None:
        """A size the memory plan may choose: a number >= ``minimum``, or ``auto``."""
        if value != "auto" and (isinstance(value, str) or value < minimum):
            self.fail(key, f"must be a number >= {minimum} or auto, got {value!r}", example)

    def in_range(self, key: str, value, ok: bool, wanted: str, fix: str) -> None:
        if not ok:  # NaN compares false, so it lands here too
            self.fail(key, f"must be {wanted}, got {value}", fix)


def check_choices(cfg: DankaConfig, at: At) -> None:
    """Every key with a fixed set of values holds one of them."""
    for key, allowed in choices().items():
        value = _get(cfg, key)
        if key == "model.torch_dtype" and isinstance(value, str):
            value = canonical_dtype(value)
        if value not in allowed:
            shown = ", ".join(sorted(str(a) for a in allowed if a is not None))
            at.fail(key, f"{value!r} is not a valid value", f"use one of: {shown}")


def validate(cfg: DankaConfig, source: ConfigSource | None = None) -> None:
    """Raise UserError on the first inconsistency, after filling in the derived values in
    place (:func:`danka.config.resolve.resolve`: algorithm presets where the user set
    nothing, samples_per_prompt, ...). After this the config is read-only: the run keeps
    its changing state elsewhere."""
    at = At(source)
    check_choices(cfg, at)
    resolve(cfg, source.explicit if source else set(), at)
    for check in CHECKS:
        check(cfg, at)


_FROZEN: dict[type, type] = {}


def _refuse(self, name, value=None):
    raise AttributeError(
        f"the config is read-only after validation (tried to set {name!r}); keep changing "
        "run state elsewhere (e.g. danka.trainer.state.RunState)"
    )


def _thawed_copy(self, memo: dict):
    """``copy.deepcopy`` of a frozen section is an ordinary, writable one (a what-if copy,
    e.g. ``danka estimate`` trying settings, is the caller's to change)."""
    base = type(self).__mro__[1]
    new = object.__new__(base)
    memo[id(self)] = new
    for f in dataclasses.fields(self):
        object.__setattr__(new, f.name, copy.deepcopy(getattr(self, f.name), memo))
    return new


def freeze(obj: object) -> None:
    """Make a validated config (and every section in it) read-only: each dataclass
    instance becomes an instance of a subclass whose ``__setattr__`` raises. ``asdict``,
    ``isinstance``, pickling and reading work as before; a deep copy is writable."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        if isinstance(obj, list):
            for item in obj:
                freeze(item)
        return
    for f in dataclasses.fields(obj):
        freeze(getattr(obj, f.name))
    cls = type(obj)
    if cls in _FROZEN.values():
        return
    if cls not in _FROZEN:
        name = f"Frozen{cls.__name__}"  # a module-level name, so pickle finds the class
        _FROZEN[cls] = globals()[name] = type(
            name,
            (cls,),
            {
                "__setattr__": _refuse,
                "__delattr__": _refuse,
                "__deepcopy__": _thawed_copy,
                "__module__": __name__,
            },
        )
    object.__setattr__(obj, "__class__", _FROZEN[cls])
