"""The registry of algorithm variants: danka.registry.Registry (torch-free, shared by
rewards, rollout engines and CLI subcommands)."""

from danka.registry import Registry

__all__ = ["Registry"]
