"""The prompts a run trains and evaluates on, ready for the rollout."""

from __future__ import annotations

from dataclasses import dataclass

from danka.types import PromptRow


@dataclass
class PromptSet:
    """Prompts ready for the rollout: rows, rendered text and token ids (no padding)."""

    rows: list[PromptRow]
    texts: list[str]
    ids: list[list[int]]
