"""``danka plot OUTPUT``: PNG curves of a run and one self-contained ``report.html``.

Reads what a run writes (``metrics.jsonl``, ``eval/step_N.json``, ``completions/step_N.jsonl``)
and works on a run in progress: a half-written last line of ``metrics.jsonl`` is skipped,
missing metrics simply leave their plot out. Figures are drawn with matplotlib's Agg canvas
through the object API (``matplotlib.figure.Figure``), so the caller's pyplot backend and
global state are never touched.
"""

from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path
from typing import Any

from danka.io import read_json_lines, read_json_object

PLOTS_DIR = "plots"
REPORT = "report.html"
_PHASE_ORDER = (
    "time/rollout",
    "time/reward",
    "time/logprobs",
    "time/values",
    "time/advantages",
    "time/update",
)
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl?$")


# ------------------------------------------------------------------------------ reading


def _number(value: Any) -> float | None:
    """A finite float from a metrics value (``"inf"`` strings and null -> None)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` in file order; unreadable lines (the half-written
    last line of a run in progress) and records without a step are skipped."""
    records = read_json_lines(path)
    return [r for r in records if _number(r.get("step")) is not None]


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of ``key`` over the records that have a finite value for it; a
    step logged twice (resume) keeps its last value."""
    by_step: dict[float, float] = {}
    for record in records:
        value = _number(record.get(key))
        if value is not None:
            by_step[float(record["step"])] = value
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def ema(values: list[float], weight: float = 0.8) -> list[float]:
    """TensorBoard-style smoothing: ``s_t = w s_{t-1} + (1 - w) x_t`` divided by the
    debias factor ``1 - w^t`` so the first points are not pulled towards 0."""
    out, acc = [], 0.0
    for t, x in enumerate(values, start=1):
        acc = weight * acc + (1.0 - weight) * x
        out.append(acc / (1.0 - weight**t))
    return out


def _step_files(folder: Path, suffix: str) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _STEP_FILE.match(path.name)
        if match and path.suffix == suffix:
            found.append((int(match.group(1)), path))
    return sorted(found)


def eval_curve(output_dir: Path, records: list[dict[str, Any]]) -> tuple[list, list]:
    """Held-out accuracy per step from ``eval/step_N.json``, else from metrics."""
    by_step: dict[float, float] = {}
    for step, path in _step_files(Path(output_dir) / "eval", ".json"):
        record = read_json_object(path)  # None when broken or no regular file: never blocks
        value = _number(record.get("eval/accuracy")) if record else None
        if value is not None:
            by_step[float(step)] = value
    for step, value in zip(*series(records, "eval/accuracy")):
        by_step.setdefault(step, value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _completion_rewards(path: Path) -> list[float]:
    values = []
    for record in read_json_lines(path, what=f"the completions file {path.name}"):
        value = _number(record.get("reward"))
        if value is not None:
            values.append(value)
    return values


def reward_distributions(output_dir: Path, records: list[dict[str, Any]]) -> dict[str, list]:
    """Rewards at the start and at the end of the run, for the histogram.

    From the per-sample rewards of the first and last ``completions/step_N.jsonl``; without
    completion files, from the per-step mean rewards of the first and last fifth of the
    steps. Returns ``{label: values}`` (empty when there is nothing to compare).
    """
    files = [(s, p) for s, p in _step_files(Path(output_dir) / "completions", ".jsonl")]
    files = [(s, v) for s, p in files if (v := _completion_rewards(p))]
    if len(files) >= 2:
        (s0, v0), (s1, v1) = files[0], files[-1]
        return {f"step {s0} (samples)": v0, f"step {s1} (samples)": v1}
    _, rewards = series(records, "reward")
    if len(rewards) >= 2:
        k = max(1, len(rewards) // 5)
        return {
            f"first {k} steps (step means)": rewards[:k],
            f"last {k} steps (step means)": rewards[-k:],
        }
    return {}


# ----------------------------------------------------------------------------- drawing


def _figure(title: str, ylabel: str, xlabel: str = "step"):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _line_plot(
    path: Path, title: str, ylabel: str, steps: list, values: list, smooth: bool = False
) -> Path:
    fig, ax = _figure(title, ylabel)
    marker = "o" if len(steps) <= 20 else None
    ax.plot(steps, values, marker=marker, alpha=0.4 if smooth else 1.0, label="per step")
    if smooth and len(values) >= 3:
        ax.plot(steps, ema(values), linewidth=2, label="smoothed (EMA 0.8)")
        ax.legend()
    return _save(fig, path)


def _timing_plot(path: Path, records: list[dict[str, Any]]) -> Path | None:
    """Seconds per step, stacked by phase (time/rollout, time/reward, ...; time/step is
    the total: what the phases do not cover is drawn as "other")."""
    found = {k for r in records for k in r if k.startswith("time/") and k != "time/step"}
    phases = [k for k in _PHASE_ORDER if k in found] + sorted(found - set(_PHASE_ORDER))
    if not phases:
        return None
    steps = [float(r["step"]) for r in records]
    stacks = [[_number(r.get(k)) or 0.0 for r in records] for k in phases]
    labels = [k.removeprefix("time/") for k in phases]
    totals = [_number(r.get("time/step")) for r in records]
    if any(t is not None for t in totals):
        covered = [sum(col) for col in zip(*stacks)]
        stacks.append([max(0.0, (t or c) - c) for t, c in zip(totals, covered)])
        labels.append("other")
    fig, ax = _figure("Time per step by phase", "seconds")
    ax.stackplot(steps, *stacks, labels=labels, alpha=0.8)
    ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def _histogram(path: Path, dists: dict[str, list]) -> Path:
    fig, ax = _figure("Reward distribution: start vs end", "count", xlabel="reward")
    for label, values in dists.items():
        ax.hist(values, bins=20, alpha=0.5, label=f"{label}, mean {sum(values) / len(values):.3f}")
    ax.legend(fontsize="small")
    return _save(fig, path)


# ------------------------------------------------------------------------------ report


def _summary(output_dir: Path, records: list[dict[str, Any]]) -> list[str]:
    lines = [f"{len(records)} steps logged"]
    for key in ("reward", "kl", "response_length"):
        steps, values = series(records, key)
        if values:
            lines.append(
                f"{key}: first {values[0]:.4g} -> last {values[-1]:.4g} (step {steps[-1]:g})"
            )
    result = Path(output_dir) / "result.json"
    data = read_json_object(result)  # None when missing, broken or no regular file
    if data is not None and "before" in data and "after" in data:
        try:
            lines.append(
                f"held-out accuracy: before {100 * data['before']:.1f}% -> after "
                f"{100 * data['after']:.1f}% ({data.get('n', '?')} problems)"
            )
        except (TypeError, ValueError):
            pass
    return lines


def write_report(output_dir: Path, pngs: list[Path], missing: list[str]) -> Path:
    """``plots/report.html``: the summary and every PNG embedded as base64 (one file that
    can be mailed or attached to an issue)."""
    output_dir = Path(output_dir)
    records = read_metrics(output_dir / "metrics.jsonl")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>danka run {html.escape(output_dir.name)}</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:auto}"
        "img{max-width:100%;border:1px solid #ddd;margin:8px 0}</style></head><body>",
        f"<h1>danka run: {html.escape(str(output_dir))}</h1><ul>",
        *[f"<li>{html.escape(line)}</li>" for line in _summary(output_dir, records)],
        "</ul>",
    ]
    for png in pngs:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(
            f"<h2>{html.escape(png.stem.replace('_', ' '))}</h2>"
            f"<img alt='{html.escape(png.stem)}' src='data:image/png;base64,{data}'>"
        )
    if missing:
        parts.append("<p>Not plotted (no data yet): " + html.escape(", ".join(missing)) + "</p>")
    parts.append("</body></html>")
    path = output_dir / PLOTS_DIR / REPORT
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def plot_run(output_dir: Path) -> list[Path]:
    """Write ``OUTPUT/plots/*.png`` and ``OUTPUT/plots/report.html``; returns their paths
    (PNGs first, the report last). Plots without data are left out, never an error."""
    output_dir = Path(output_dir)
    records = read_metrics(output_dir / "metrics.jsonl")
    out = output_dir / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    missing: list[str] = []

    def line(name: str, key: str, title: str, ylabel: str, smooth: bool = False) -> None:
        steps, values = series(records, key)
        if values:
            written.append(_line_plot(out / f"{name}.png", title, ylabel, steps, values, smooth))
        else:
            missing.append(name)

    line("reward", "reward", "Mean reward per step", "reward", smooth=True)
    steps, acc = eval_curve(output_dir, records)
    if acc:
        written.append(
            _line_plot(out / "eval_accuracy.png", "Held-out accuracy", "accuracy", steps, acc)
        )
    else:
        missing.append("eval_accuracy")
    line("kl", "kl", "KL to the reference policy", "KL (nats/token)", smooth=True)
    line("entropy", "actor/entropy", "Policy entropy", "nats/token", smooth=True)
    line("response_length", "response_length", "Mean response length", "tokens", smooth=True)
    timing = _timing_plot(out / "timings.png", records)
    if timing:
        written.append(timing)
    else:
        missing.append("timings")
    dists = reward_distributions(output_dir, records)
    if dists:
        written.append(_histogram(out / "reward_histogram.png", dists))
    else:
        missing.append("reward_histogram")
    return [*written, write_report(output_dir, written, missing)]
