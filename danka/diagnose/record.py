"""What the run doctor reads: one run's config, metrics, evaluations and completions, as
plain data (:class:`RunRecord`), and :func:`read_run_dir`, the only function here that
touches files."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.io import read_json_lines

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl?$")


@dataclass
class RunRecord:
    """A finished or live run. Every list is in step order.

    ``config``: the resolved config (``OUTPUT/config.json``); ``metrics``: one dict per
    training step (``metrics.jsonl``, key ``step`` 1-based); ``evals``: one dict per
    held-out evaluation (``eval/step_N.json``: ``step``, ``eval/accuracy``, ...; step 0 is
    before training); ``completions``: (step, records of ``completions/step_N.jsonl``:
    ``prompt``, ``completion``, ``reward``, ``rewards``, ``ground_truth``).
    """

    config: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    completions: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)


def _step_files(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name))]
    return sorted(found)


def read_run_dir(path: str | Path) -> RunRecord:
    """Read ``path`` (a ``danka train`` output_dir, finished or still running).

    UserError (exit 2) when it is not a folder or holds neither ``metrics.jsonl`` nor
    ``config.json``. Missing eval/ or completions/ folders are fine (fewer checks run)."""
    folder = Path(path)
    fix = "give the output_dir of a danka train run (it holds metrics.jsonl and config.json)"
    if not folder.is_dir():
        raise UserError("run folder not found", where=str(folder), fix=fix)
    metrics_path, config_path = folder / "metrics.jsonl", folder / "config.json"
    if not metrics_path.exists() and not config_path.exists():
        raise UserError("no metrics.jsonl or config.json here: not a run folder",
                        where=str(folder), fix=fix)  # fmt: skip
    config: dict[str, Any] = {}
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise UserError(f"config.json is not valid JSON ({err})", where=str(config_path),
                            fix=fix) from None  # fmt: skip
    metrics = read_json_lines(metrics_path)
    metrics = sorted(
        (m for m in metrics if isinstance(m.get("step"), int)), key=lambda m: m["step"]
    )
    evals = []
    for step, p in _step_files(folder / "eval"):
        try:
            record = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            continue  # being written
        if isinstance(record, dict):
            evals.append({"step": step, **record})
    completions = [(step, read_json_lines(p)) for step, p in _step_files(folder / "completions")]
    return RunRecord(config=config, metrics=metrics, evals=evals, completions=completions)
