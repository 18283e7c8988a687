"""The names a step's reward is logged under besides the terms' own (``reward/<name>``):
danka's numbers about the reward and the parts danka adds to the sum itself. A term
named like one of them would overwrite it, so a label is refused (specs.py) and a
function's own name gets ``_2`` (:func:`unique_name`). Torch-free: the config check
and the run doctor read it."""

from __future__ import annotations

# danka's numbers about a step's reward: the RewardStats fields of these names
# (danka/step/records.py), logged as reward/<name> by danka/step/metrics.py
OWN_METRICS = ("error_rate", "not_applicable", "valid_frac", "zero_adv_groups")
REWARD_MODEL = "reward_model"  # model.reward_model_name_or_path's score
ENV = "env"  # an environment's step rewards (agent.environment)
OVERLONG = "overlong"  # DAPO's soft overlong penalty (reward.overlong_buffer)
RESERVED = (*OWN_METRICS, REWARD_MODEL, ENV, OVERLONG)


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``... where it is taken (a reserved name counts
    as taken: pass ``set(RESERVED)`` first); the result is added to ``taken``."""
    key, k = name, 2
    while key in taken:
        key, k = f"{name}_{k}", k + 1
    taken.add(key)
    return key
