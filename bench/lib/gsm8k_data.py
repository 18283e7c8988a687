"""GSM8K as the benchmarks at the real shape read it: the example's settings, its rows,
their path.

The GSM8K examples (``examples/gsm8k_grpo.yaml``, ``gsm8k_ppo.yaml``) append verl's
instruction to each question and render it with the model's chat template; the rollout,
TRL and step benchmarks use the same rows the same way, through danka's own reader.
"""

from __future__ import annotations

from pathlib import Path

from bench.lib.common import ROOT

GSM8K_EXAMPLE = ROOT / "examples" / "gsm8k_grpo.yaml"


def example() -> dict:
    """``examples/gsm8k_grpo.yaml`` as written (a dict: the settings other tools copy)."""
    import yaml

    return yaml.safe_load(GSM8K_EXAMPLE.read_text())


def example_instruction() -> str:
    """The example's ``data.instruction`` (verl's "####" instruction)."""
    return example()["data"]["instruction"]


def data_path(path: str | Path) -> Path:
    """``path`` as given when it exists or is absolute, else under the repository root (so
    ``data/gsm8k/train.jsonl`` works from any folder)."""
    path = Path(path)
    return path if path.is_absolute() or path.exists() else ROOT / path


def gsm8k_rows(path: str | Path, n: int) -> list:
    """The first ``n`` rows (``PromptRow``: question, ground truth) of a GSM8K jsonl, the
    file repeated when it has fewer."""
    from danka.data.formats import Columns, load_prompt_rows

    rows = load_prompt_rows(str(data_path(path)), Columns(fmt="gsm8k")).rows
    return (rows * (n // len(rows) + 1))[:n]
