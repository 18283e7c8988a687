"""danka (单卡, "one card"): RL post-training for LLMs on one GPU or a CPU."""

__version__ = "0.1.0"
