"""What the run doctor reads: one run's config, metrics, evaluations and completions, as
plain data (:class:`RunRecord`), and :func:`read_run_dir`, the only function here that
touches files."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danka.diagnose.series import MetricTable
from danka.errors import UserError
from danka.io import read_json_lines
from danka.safe_read import iter_json_lines, loads_json, read_text

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl?$")


@dataclass
class RunRecord:
    """A finished or live run. Every list is in step order.

    ``config``: the resolved config (``OUTPUT/config.json``); ``metrics``: one record per
    training step (``metrics.jsonl``, key ``step`` 1-based), kept as a
    :class:`~danka.diagnose.series.MetricTable` (a list of dicts given is converted);
    ``evals``: one dict per held-out evaluation (``eval/step_N.json``: ``step``,
    ``eval/accuracy``, ...; step 0 is before training); ``completions``: (step, records of
    ``completions/step_N.jsonl``: ``prompt``, ``completion``, ``reward``, ``rewards``,
    ``ground_truth``).
    """

    config: dict[str, Any] = field(default_factory=dict)
    metrics: MetricTable = field(default_factory=MetricTable)
    evals: list[dict[str, Any]] = field(default_factory=list)
    completions: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, MetricTable):
            self.metrics = MetricTable(self.metrics)


def _step_files(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name))]
    return sorted(found)


FIX = "give the output_dir of a danka train run (it holds metrics.jsonl and config.json)"
_DAMAGED = (
    "move or delete this file (danka writes it as a regular UTF-8 JSON file); only files "
    "danka wrote belong in a run folder"
)


def _metrics(path: Path) -> MetricTable:
    """``metrics.jsonl`` streamed into a table, in step order (records without an int step
    dropped; a resumed run's lines may come out of order)."""
    if not path.exists() and not path.is_symlink():
        return MetricTable()
    table = MetricTable(
        v
        for _, v in iter_json_lines(path, what="metrics.jsonl", fix=_DAMAGED)
        if isinstance(v, dict) and isinstance(v.get("step"), int) and 0 <= v["step"] < 2**62
    )
    steps = [table.step_at(i) for i in range(len(table))]
    if all(a <= b for a, b in zip(steps, steps[1:])):
        return table
    return MetricTable(table[i] for i in sorted(range(len(table)), key=steps.__getitem__))


def _eval_record(path: Path) -> Any:
    """An ``eval/step_N.json``'s value; None while it is being written (does not parse
    yet). A file no evaluation writes (a pipe, a folder, not UTF-8, nested thousands of
    levels deep) is a UserError."""
    what = f"the evaluation file {path.name}"
    text = read_text(path, what=what, fix=_DAMAGED)
    try:
        return loads_json(text, where=str(path), what=what, fix=_DAMAGED)
    except UserError as err:
        if "nested deeper" in err.what:
            raise
        return None  # being written


def read_run_dir(path: str | Path) -> RunRecord:
    """Read ``path`` (a ``danka train`` output_dir, finished or still running).

    UserError (exit 2) when it is not a folder or holds neither ``metrics.jsonl`` nor
    ``config.json``, or when a file the doctor reads is no regular UTF-8 JSON file (a named
    pipe, a folder, a symlink loop, a device; see danka.safe_read): every read is bounded.
    Missing eval/ or completions/ folders are fine (fewer checks run)."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError("run folder not found", where=str(folder), fix=FIX)
    metrics_path, config_path = folder / "metrics.jsonl", folder / "config.json"
    if not any(p.exists() or p.is_symlink() for p in (metrics_path, config_path)):
        raise UserError(
            "no metrics.jsonl or config.json here: not a run folder", where=str(folder), fix=FIX
        )
    config: Any = {}
    if config_path.exists() or config_path.is_symlink():
        config = loads_json(
            read_text(config_path, what="config.json", fix=_DAMAGED),
            where=str(config_path),
            what="config.json",
            fix=_DAMAGED,
        )
    if not isinstance(config, dict):
        raise UserError(
            f"config.json holds a JSON {type(config).__name__}, not the run's config (an object)",
            where=str(config_path),
            fix=FIX,
        )
    metrics = _metrics(metrics_path)
    evals = []
    for step, p in _step_files(folder / "eval"):
        record = _eval_record(p)
        if isinstance(record, dict):
            evals.append({"step": step, **record})
    completions = [
        (step, read_json_lines(p, what=f"the completions file {p.name}", fix=_DAMAGED))
        for step, p in _step_files(folder / "completions")
    ]
    return RunRecord(config=config, metrics=metrics, evals=evals, completions=completions)
