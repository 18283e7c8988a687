"""Named algorithms (``trainer.algorithm``): an advantage estimator plus the settings its
paper uses. A preset value is applied only where the user did not set the key
explicitly (config file or override): what the user writes always wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from danka.registry import Registry


@dataclass(frozen=True)
class AlgorithmPreset:
    advantage_estimator: str  # entry of ADVANTAGE_ESTIMATORS
    settings: dict[str, Any] = field(default_factory=dict)  # "section.key" -> paper's value
    paper: str = ""


ALGORITHMS: Registry[None] = Registry("algorithm")
ALGORITHMS.add("ppo", AlgorithmPreset("gae", paper="Schulman et al. 2017, arXiv:1707.06347"))
ALGORITHMS.add("grpo", AlgorithmPreset("grpo", paper="Shao et al. 2024, arXiv:2402.03300"))
ALGORITHMS.add(
    "dr_grpo",
    AlgorithmPreset(
        "dr_grpo",  # no division by the group std
        {"loss.agg_mode": "seq-mean-token-sum-norm"},  # constant divisor: no length bias
        paper="Liu et al. 2025, arXiv:2503.20783",
    ),
)
ALGORITHMS.add("rloo", AlgorithmPreset("rloo", paper="Ahmadian et al. 2024, arXiv:2402.14740"))
ALGORITHMS.add(
    "reinforce_plus_plus",
    AlgorithmPreset("reinforce_plus_plus", paper="Hu 2025, arXiv:2501.03262"),
)
ALGORITHMS.add(
    "reinforce_plus_plus_baseline",
    AlgorithmPreset("reinforce_plus_plus_baseline", paper="Hu 2025, arXiv:2501.03262"),
)
ALGORITHMS.add(
    "gspo",
    AlgorithmPreset(
        "grpo",
        {  # sequence-level ratio and the paper's clip ranges (sec. 5.1), seq-mean-token-mean
            "loss.policy_loss": "gspo",
            "loss.clip_ratio_low": 3e-4,
            "loss.clip_ratio_high": 4e-4,
            "loss.agg_mode": "seq-mean-token-mean",
        },
        paper="Zheng et al. 2025, arXiv:2507.18071",
    ),
)
