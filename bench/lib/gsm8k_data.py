"""GSM8K as the benchmarks at the real shape read it: the example's settings, its rows,
their path; and how a learning curve is read (its metrics, the minutes to verl's PPO
accuracies), the same for danka's run and a peer's.

The GSM8K examples (``examples/gsm8k_grpo.yaml``, ``gsm8k_ppo.yaml``) append verl's
instruction to each question and render it with the model's chat template; the rollout,
TRL and step benchmarks use the same rows the same way, through danka's own reader.
"""

from __future__ import annotations

from pathlib import Path

from bench.lib.common import ROOT

GSM8K_EXAMPLE = ROOT / "examples" / "gsm8k_grpo.yaml"
# verl's PPO run on Qwen2.5-0.5B-Instruct, one GPU: strict accuracy on the GSM8K test set
# after that many minutes of training (its published logs; 256 prompts x 1 answer, 512
# new tokens, ~66 s a step).
VERL_PPO = ((0.458, 36.0), (0.512, 97.0), (0.556, 204.0), (0.569, 522.0))
# the labels of the example's reward list: what a GSM8K learning curve reports
METRICS = ("strict", "flexible", "boxed", "format")


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


# the strict accuracies whose minutes a GSM8K curve reports (``minutes_to``): the plateau
# of the first recipes (33%), the 20-minute goal (38%) and the steps between
STRICT_MARKS = (0.30, 0.33, 0.36, 0.38)


def first_at(curve: list[dict], strict: float) -> dict | None:
    """The first evaluation of ``curve`` at or above ``strict`` accuracy, or None."""
    return next((p for p in curve if (p["strict"] or 0.0) >= strict), None)


def minutes_to(
    curve: list[dict], marks: tuple[float, ...] = STRICT_MARKS
) -> dict[str, float | None]:
    """For each strict accuracy in ``marks``: the minute of the first evaluation at or
    above it (``None``: not reached), keyed ``"0.33"``. The middle evaluations may use a
    subset of the test set: each point's ``n`` says."""
    return {f"{mark:.3g}": (first_at(curve, mark) or {}).get("minute") for mark in marks}


def milestones(curve: list[dict]) -> list[dict]:
    """For each of verl's strict accuracies: the first evaluation at or above it (its
    minute, and verl's minutes / ours), or ``reached: false``."""
    out = []
    for target, verl_minutes in VERL_PPO:
        hit = first_at(curve, target)
        row: dict = {"strict": target, "verl_minutes": verl_minutes, "reached": hit is not None}
        if hit is not None and hit["minute"]:
            row.update(minutes=hit["minute"], n=hit["n"],
                       speedup_vs_verl=round(verl_minutes / hit["minute"], 2))  # fmt: skip
        out.append(row)
    return out
