"""Reward-model training from preference pairs (``danka rm``)."""
