"""The one place the run doctor reads config keys: ``setting(config, name)``.

The checks never spell a config path. Each logical setting maps to its dotted path(s) in
the resolved config (``OUTPUT/config.json``); the first path present wins, so when a key
moves (``trainer.lr`` -> ``optim.lr``) add the new path FIRST and runs written with the old
layout stay readable. ``key(name)`` is the path a fix message tells the user to set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from danka.rewards.names import RESERVED, unique_name

# name -> (dotted paths, newest layout first; the schema default).
# The default is used when no path is present, and by checks that only flag a value the
# user chose (a value equal to the schema default is not a choice).
SETTINGS: dict[str, tuple[tuple[str, ...], Any]] = {
    "algorithm": (("trainer.algorithm",), "grpo"),
    "estimator": (("trainer.advantage_estimator",), None),
    "policy_loss": (("loss.policy_loss", "trainer.policy_loss"), "vanilla"),
    "loss_agg_mode": (("loss.agg_mode", "trainer.loss_agg_mode"), "token-mean"),
    "lr": (("optim.lr", "trainer.lr"), 1e-5),
    "critic_lr": (("optim.critic_lr", "trainer.critic_lr"), 1e-5),
    "clip_ratio_low": (("loss.clip_ratio_low", "trainer.clip_ratio_low"), 0.2),
    "clip_ratio_high": (("loss.clip_ratio_high", "trainer.clip_ratio_high"), 0.2),
    "dual_clip_c": (("loss.dual_clip_c", "trainer.dual_clip_c"), 3.0),
    "value_clip": (("loss.value_clip", "trainer.value_clip"), 0.2),
    "vf_coef": (("loss.vf_coef", "trainer.vf_coef"), 0.5),
    "lam": (("trainer.lam",), 0.95),
    "kl_coef": (("loss.kl.coef", "trainer.kl.coef"), 0.0),
    "kl_adaptive": (("loss.kl.adaptive", "trainer.kl.adaptive"), False),
    "ppo_epochs": (("trainer.ppo_epochs",), 1),
    "batch_size": (("trainer.batch_size",), 8),
    "mini_batch_size": (("trainer.mini_batch_size",), None),
    "samples_per_prompt": (("trainer.samples_per_prompt",), None),
    "rollout_correction": (("trainer.rollout_correction.mode",), "none"),
    "max_new_tokens": (("trainer.max_new_tokens",), 128),
    "mask_truncated": (("loss.mask_truncated", "trainer.mask_truncated"), False),
    "overlong_buffer": (("reward.overlong_buffer.length",), 0),
    "lora": (("lora.enable_lora",), True),
    "reward_functions": (("reward.functions",), []),
    "reward_model": (("model.reward_model_name_or_path",), None),
    "reward_model_weight": (("reward.model_weight",), 1.0),
    "dynamic_sampling": (("sampling.dynamic_sampling", "trainer.dynamic_sampling"), False),
    "result_file": (("logging.result_file",), "result.json"),
}

_MISSING = object()


def _lookup(config: dict, path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def setting(config: dict, name: str) -> Any:
    """The value of logical setting ``name`` in a resolved config dict (the first of its
    paths present), else its schema default. KeyError for a name not in SETTINGS."""
    paths, default = SETTINGS[name]
    for path in paths:
        value = _lookup(config, path)
        if value is not _MISSING:
            return value
    return default


def default(name: str) -> Any:
    """The schema default of ``name``."""
    return SETTINGS[name][1]


def chosen(config: dict, name: str) -> bool:
    """The config sets ``name`` to something other than its schema default."""
    return setting(config, name) != default(name)


def key(name: str) -> str:
    """The dotted key to name in a message (the newest layout's path)."""
    return SETTINGS[name][0][0]


def add_kl() -> str:
    """The advice every drift and collapse finding gives (verl's GRPO recipes: 0.001)."""
    return f"add a KL to the reference ({key('kl_coef')}: 0.001)"


def estimator(config: dict) -> str:
    """The advantage estimator the run uses (the resolved one, else the algorithm's)."""
    est = setting(config, "estimator")
    if est:
        return str(est)
    algo = str(setting(config, "algorithm"))
    return "gae" if algo == "ppo" else algo


def has_critic(config: dict) -> bool:
    """Only GAE reads critic values (danka.algorithms.advantages: needs_critic)."""
    return estimator(config) == "gae"


def optimizer_steps_per_rollout(config: dict) -> int:
    """ppo_epochs x batch_size / mini_batch_size (mini_batch_size null = batch_size)."""
    batch = int(setting(config, "batch_size") or 1)
    mini = int(setting(config, "mini_batch_size") or batch)
    return int(setting(config, "ppo_epochs") or 1) * max(1, batch // max(1, mini))


@dataclass(frozen=True)
class RewardTerm:
    """One part of the training reward, as the metrics name it (``reward/<key>``)."""

    key: str  # metric suffix: the function's name, repeats as name_2, name_3 (combine.py)
    weight: float
    primary: bool  # the first function: the one held-out accuracy is judged by


def _short_name(name: str) -> str:
    """``path/file.py:function`` -> ``function`` (danka.rewards.combine's naming)."""
    file, sep, func = str(name).rpartition(":")
    return func if sep and file.endswith(".py") and func else str(name)


def reward_terms(config: dict) -> list[RewardTerm]:
    """The terms of the reward sum in config order, named as ``reward/<key>`` metrics:
    the functions (by label, else name; repeated or reserved names get ``_2``, ``_3``: danka.rewards.names), the
    reward model, and the DAPO overlong penalty (weight 1) when it is on."""
    taken = set(RESERVED)
    terms: list[RewardTerm] = []
    for k, fn in enumerate(setting(config, "reward_functions") or []):
        if isinstance(fn, dict):  # a label is the logged name (reward.functions[].label)
            name = fn.get("label") or _short_name(fn.get("name", ""))
        else:
            name = _short_name(fn)
        unique = unique_name(name, taken)
        weight = float(fn.get("weight", 1.0)) if isinstance(fn, dict) else 1.0
        terms.append(RewardTerm(unique, weight, primary=k == 0))
    if setting(config, "reward_model"):
        weight = float(setting(config, "reward_model_weight"))
        terms.append(RewardTerm("reward_model", weight, primary=not terms))
    if int(setting(config, "overlong_buffer") or 0) > 0:
        terms.append(RewardTerm("overlong", 1.0, primary=False))
    return terms
