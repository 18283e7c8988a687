"""Per-step metrics: the console/train.log line, ``metrics.jsonl`` and completion dumps.

``metrics.jsonl`` holds one JSON object per step, each line flushed and fsynced so a kill
loses nothing already written; non-finite floats become ``null`` (NaN) or ``"inf"`` /
``"-inf"`` so every line stays valid JSON. On resume, :func:`truncate_metrics_after` drops
the steps after the checkpoint, which will be redone.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from danka.io import write_text_atomic
from danka.safe_read import iter_lines, open_regular

# loss and reward always come first (``grep reward:`` on train.log); then these; then the
# remaining keys alphabetically; time/* keys last.
_FIRST = ("loss", "reward")
_NEXT = ("kl", "entropy", "response_length")
# the short line (logging.verbose: false): what says whether a step went well, and its time
SHORT = ("kl", "actor/entropy", "response_length", "response/truncated", "time/step")


def _ordered_keys(metrics: dict[str, Any]) -> list[str]:
    rest = [k for k in metrics if k not in _FIRST and k not in _NEXT]
    timing = sorted(k for k in rest if k.startswith("time/"))
    other = sorted(k for k in rest if not k.startswith("time/"))
    return [k for k in _NEXT if k in metrics] + other + timing


def _as_number(value: Any) -> Any:
    """Python number from a float / int / bool / 0-d tensor or numpy scalar; else unchanged."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        try:
            return value.item()
        except (ValueError, RuntimeError):
            return value
    return value


def _fmt_value(key: str, value: Any) -> str:
    value = _as_number(value)
    if isinstance(value, bool) or isinstance(value, str) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if key.startswith("time/"):
        return f"{value:.2f}s"
    if "length" in key or "tokens" in key:
        return f"{value:.1f}"
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4f}"


def format_step_line(step: int, metrics: dict[str, float], *, verbose: bool = True) -> str:
    """``step 3 | loss: 0.1234, reward: 0.5000, kl: 0.0012, ..., time/step: 5.20s``.

    ``loss`` and ``reward`` are always present (``nan`` if missing), the other keys follow
    in a stable order: kl, entropy, response_length, the rest sorted, then ``time/*``;
    ``verbose=False``: only the :data:`SHORT` keys after them (~130 characters, not ~900).
    """
    parts = [f"{k}: {_fmt_value(k, metrics.get(k, float('nan')))}" for k in _FIRST]
    keys = _ordered_keys(metrics) if verbose else [k for k in SHORT if k in metrics]
    parts += [f"{k}: {_fmt_value(k, metrics[k])}" for k in keys]
    return f"step {step} | " + ", ".join(parts)


def to_json_safe(value: Any) -> Any:
    """Recursively turn a metrics value into strict JSON: NaN -> None, +-inf -> "inf"/"-inf",
    tensors / numpy values -> python numbers or lists, unknown objects -> str."""
    value = _as_number(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_safe(v) for v in value]
    if hasattr(value, "tolist"):
        return to_json_safe(value.tolist())
    return str(value)


def _dumps(obj: Any) -> str:
    return json.dumps(to_json_safe(obj), allow_nan=False, ensure_ascii=False)


def _drop_partial_tail(path: Path) -> None:
    """A kill in the middle of a write can leave half a line; cut it so appends stay valid
    (the file is read backwards from its end, a chunk at a time: a pipe or a device in its
    place is a UserError, danka.safe_read)."""
    if not path.exists() and not path.is_symlink():
        return
    with open_regular(path, what="metrics.jsonl") as f:
        end = f.seek(0, 2)
        pos = end
        while pos > 0:
            start = max(0, pos - (1 << 20))
            f.seek(start)
            chunk = f.read(pos - start)
            if pos == end and chunk.endswith(b"\n"):
                return  # whole lines only
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                pos = start + cut + 1
                break
            pos = start
    with open(path, "r+b") as f:
        f.truncate(pos)


class MetricsWriter:
    """Appends ``{"step": N, "timestamp": unix, **metrics}`` lines to ``OUTPUT/metrics.jsonl``."""

    def __init__(self, output_dir: Path):
        self.path = Path(output_dir) / "metrics.jsonl"
        self._file = None  # opened by the first write: a run that fails before its first
        # step leaves no (empty) metrics file

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": int(step), "timestamp": round(time.time(), 3), **metrics}
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _drop_partial_tail(self.path)
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(_dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CompletionsWriter:
    """Writes ``OUTPUT/completions/step_<N>.jsonl``: one sample per line with prompt,
    completion, combined reward, per-function rewards and ground truth."""

    def __init__(self, output_dir: Path):
        self.dir = Path(output_dir) / "completions"

    def write(
        self,
        step: int,
        *,
        prompts: list[Any],
        completions: list[str],
        rewards: list[float],
        reward_parts: dict[str, list[float | None]] | None = None,
        ground_truths: list[str | None] | None = None,
    ) -> Path:
        """``reward_parts[name][i]`` is reward function ``name``'s score of sample ``i``."""
        n = len(completions)
        if len(prompts) != n or len(rewards) != n:
            raise ValueError(f"{len(prompts)} prompts, {n} completions, {len(rewards)} rewards")
        reward_parts = reward_parts or {}
        lines = []
        for i in range(n):
            row = {
                "step": int(step),
                "prompt": prompts[i],
                "completion": completions[i],
                "reward": rewards[i],
                "rewards": {name: values[i] for name, values in reward_parts.items()},
                "ground_truth": ground_truths[i] if ground_truths is not None else None,
            }
            lines.append(_dumps(row))
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step_{step}.jsonl"
        write_text_atomic(path, "".join(line + "\n" for line in lines))
        return path


def truncate_metrics_after(output_dir: Path, step: int) -> int:
    """Drop ``metrics.jsonl`` lines whose step is > ``step`` (and unreadable half-lines);
    rewrite the file atomically. Returns the number of lines removed."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists() and not path.is_symlink():
        return 0
    kept, removed = [], 0
    for _, raw in iter_lines(path, what="metrics.jsonl"):  # bounded; a pipe is refused
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
            record = json.loads(line)
            line_step = int(record["step"])
        except (ValueError, KeyError, TypeError, RecursionError):
            removed += 1
            continue
        if line_step > step:
            removed += 1
        else:
            kept.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in kept))
    return removed


def remove_completions_after(output_dir: Path, step: int) -> int:
    """Delete ``completions/step_<N>.jsonl`` with N > ``step``; returns how many."""
    folder = Path(output_dir) / "completions"
    removed = 0
    for path in folder.glob("step_*.jsonl") if folder.is_dir() else []:
        suffix = path.stem.removeprefix("step_")
        if suffix.isdigit() and int(suffix) > step:
            path.unlink()
            removed += 1
    return removed
