"""Generation backends behind one interface (``RolloutEngine``)."""

from danka.rollout.base import ROLLOUT_ENGINES, RolloutEngine, SamplingParams, build_engine

__all__ = ["ROLLOUT_ENGINES", "RolloutEngine", "SamplingParams", "build_engine"]
