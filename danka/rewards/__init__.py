"""Rewards: rule rewards (builtin.py), user functions (custom.py), safe calling (guard.py,
in worker processes: worker.py), reward models (model.py), their weighted sum
(combine.py) and the start-up check of names and kwargs (specs.py).

Names are imported lazily (PEP 562): the reward worker process imports
``danka.rewards.guard``, which must not pull in torch/transformers through this file.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "REWARDS": "builtin",
    "register_reward": "builtin",
    "default_reward_for": "builtin",
    "CustomReward": "custom",
    "load_reward_function": "custom",
    "GuardedReward": "guard",
    "RewardFunctionError": "guard",
    "ClassifierReward": "model",
    "JudgeReward": "model",
    "RewardSpec": "combine",
    "RewardOutput": "combine",
    "RewardComputer": "combine",
    "build_reward_computer": "combine",
    "check_reward_specs": "specs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"danka.rewards.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'danka.rewards' has no attribute {name!r}")
