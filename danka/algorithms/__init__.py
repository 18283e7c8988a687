"""Pure RL algorithms: advantage estimators, policy/value losses, KL estimators.

No trainer, HF or logging imports: tensors in, tensors out. Each kind lives in a
registry of functions with one signature; config strings pick entries by name.
"""

from danka.algorithms._masked import masked_mean, masked_sum, masked_var, masked_whiten
from danka.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInput,
    sequence_rewards_to_tokens,
)
from danka.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
)
from danka.algorithms.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    LossNorm,
    PolicyLossInput,
    PolicyLossParams,
    aggregate,
    check_agg_mode,
    value_loss,
)
from danka.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInput",
    "FixedKLController",
    "LossNorm",
    "PolicyLossInput",
    "PolicyLossParams",
    "Registry",
    "aggregate",
    "apply_kl_in_reward",
    "check_agg_mode",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "sequence_rewards_to_tokens",
    "value_loss",
]
