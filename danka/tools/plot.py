"""``danka plot OUTPUT``: PNG curves of a run and one self-contained ``report.html``.

Reads what a run writes (``metrics.jsonl``, ``eval/step_N.json``, ``completions/step_N.jsonl``,
through the run doctor's :func:`danka.diagnose.read_run_dir`) and works on a run in
progress: a half-written last line is skipped, missing data simply leave their plot out.
Held-out accuracy is drawn in percent next to the guess floor; the reward with the spread
of the sampled rewards around it, or for a 0/1 reward its answer groups (any right, every
right, mixed); the timings by the phases that ran; every legend below its axes, off the
data. The report (:mod:`danka.tools.report`) opens with the run's header and the verdict
(:mod:`danka.tools.verdict`), then answers before -> after (:mod:`danka.tools.run_story`). Figures are drawn with matplotlib's Agg canvas
through the object API (``matplotlib.figure.Figure``), so the caller's pyplot backend and
global state are never touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from danka.diagnose import RunRecord
from danka.io import read_json_lines
from danka.tools.run_story import answer_pairs, header_of, probe_drift
from danka.tools.verdict import CORRECT, doctor, number, verdict_of

PLOTS_DIR = "plots"
# the labelled functions' lines: neither the accuracy's blue nor the guess floor's red
_FUNCTION_COLOURS = [
    "tab:orange",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
]
_PHASE_ORDER = (
    "time/rollout",
    "time/reward",
    "time/logprobs",
    "time/values",
    "time/advantages",
    "time/update",
)


# ------------------------------------------------------------------------------ reading


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` in file order; unreadable lines (the half-written
    last line of a run in progress) and records without a step are skipped."""
    records = read_json_lines(path)
    return [r for r in records if number(r.get("step")) is not None]


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of ``key`` over the records that have a finite value for it; a
    step logged twice (resume) keeps its last value."""
    by_step: dict[float, float] = {}
    for record in records:
        value = number(record.get(key))
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


def eval_curve(
    rec: RunRecord, records: list[dict[str, Any]], key: str = "eval/accuracy", x: str = "step"
) -> tuple[list[float], list[float]]:
    """``key`` per evaluation from ``eval/step_N.json`` (older runs: from metrics), against
    ``x``: the evaluation's step, or ``"eval/minutes"`` (minutes since the run started)."""
    by_x: dict[float, float] = {}
    for record in rec.evals:
        at, value = number(record.get(x)), number(record.get(key))
        if at is not None and value is not None:
            by_x[at] = value
    if x == "step":
        for step, value in zip(*series(records, key)):
            by_x.setdefault(step, value)
    xs = sorted(by_x)
    return xs, [by_x[v] for v in xs]


@dataclass(frozen=True)
class Lines:
    """The data of the accuracy chart, in percent: ``{label: (x, y)}`` and the guess floor."""

    xlabel: str
    lines: dict[str, tuple[list[float], list[float]]]
    floor: float | None


def accuracy_lines(rec: RunRecord, records: list[dict[str, Any]], x: str = "step") -> Lines:
    """Held-out accuracy in percent (``eval/accuracy``, then each labelled function's
    ``eval/correct/<name>``) against the step or the wall-clock minutes, with the guess
    floor the evaluations recorded."""
    lines: dict[str, tuple[list[float], list[float]]] = {}
    names = dict.fromkeys(k for e in rec.evals for k in e if k.startswith(CORRECT))
    for key in ("eval/accuracy", *names):
        xs, ys = eval_curve(rec, records, key, x)
        if ys:
            lines[key.removeprefix(CORRECT)] = (xs, [100 * y for y in ys])
    floors = [number(e.get("eval/guess_floor")) for e in rec.evals]
    floor = next((100 * f for f in reversed(floors) if f is not None), None)
    return Lines("step" if x == "step" else "minutes since the start", lines, floor)


@dataclass(frozen=True)
class Spread:
    """The rewards of one step's saved samples (``completions/step_N.jsonl``)."""

    step: int
    n: int
    mean: float
    std: float  # population standard deviation
    low: float  # min
    high: float  # max


def reward_spread(rec: RunRecord) -> list[Spread]:
    """Per step with saved completions: how the sampled rewards spread around their mean."""
    out = []
    for step, rows in rec.completions:
        values = [v for r in rows if (v := number(r.get("reward"))) is not None]
        if values:
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            out.append(Spread(step, len(values), mean, std, min(values), max(values)))
    return out


def binary(rec: RunRecord) -> bool:
    """Every saved sample's reward is 0 or 1 (a correctness reward): a mean +- std band
    then spans 0..1 and says little; the groups' outcomes say more."""
    values = {number(r.get("reward")) for _, rows in rec.completions for r in rows}
    values.discard(None)
    return bool(values) and values <= {0.0, 1.0}


@dataclass(frozen=True)
class Groups:
    """One step's saved answer groups (the samples of one prompt) under a 0/1 reward."""

    step: int
    n: int  # groups of two or more saved samples
    any_correct: float  # fraction of groups with at least one answer rewarded 1
    all_correct: float  # fraction of groups with every answer rewarded 1


def group_outcomes(rec: RunRecord) -> list[Groups]:
    """Per step with saved completions: how many prompts' groups had any / every answer
    right (a group with some right and some wrong is what GRPO learns from)."""
    out = []
    for step, rows in rec.completions:
        by_prompt: dict[str, list[float]] = {}
        for r in rows:
            value, prompt = number(r.get("reward")), r.get("prompt")
            if value is not None and isinstance(prompt, str):
                by_prompt.setdefault(prompt, []).append(value)
        groups = [g for g in by_prompt.values() if len(g) >= 2]
        if groups:
            n = len(groups)
            anyone = sum(max(g) >= 1 for g in groups) / n
            out.append(Groups(step, n, anyone, sum(min(g) >= 1 for g in groups) / n))
    return out


def reward_distributions(rec: RunRecord, records: list[dict[str, Any]]) -> dict[str, list]:
    """Rewards at the start and at the end of the run, for the histogram.

    From the per-sample rewards of the first and last ``completions/step_N.jsonl``; without
    completion files, from the per-step mean rewards of the first and last fifth of the
    steps. Returns ``{label: values}`` (empty when there is nothing to compare).
    """
    saved = [
        (s, [v for r in rows if (v := number(r.get("reward"))) is not None])
        for s, rows in rec.completions
    ]
    saved = [(s, v) for s, v in saved if v]
    if len(saved) >= 2:
        (s0, v0), (s1, v1) = saved[0], saved[-1]
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

    fig = Figure(figsize=(7, 4.4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _legend(fig, ax) -> None:
    """The legend below the axes, outside them: never over the data; as many columns as
    the longest label leaves room for in the figure's width."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=max(1, min(3, len(labels), 84 // (8 + max(map(len, labels))))),
            fontsize="small",
            frameon=False,
        )


def _save(fig, path: Path) -> Path:
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
        _legend(fig, ax)
    return _save(fig, path)


def accuracy_figure(data: Lines, title: str):
    """The accuracy chart: ``eval/accuracy`` bold, each labelled function dashed, the
    guess floor as a red dotted line; y in percent from 0."""
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    fig, ax = _figure(title, "held-out accuracy", data.xlabel)
    main = data.lines.get("eval/accuracy")
    colours = iter(_FUNCTION_COLOURS * len(data.lines))
    for label, (xs, ys) in data.lines.items():
        if label == "eval/accuracy":
            style = {"linewidth": 2.5, "color": "tab:blue", "zorder": 3, "label": "accuracy"}
        else:
            same = " (= accuracy)" if (xs, ys) == main else ""
            style = {
                "linewidth": 1.2,
                "linestyle": "--",
                "color": next(colours),
                "label": label + same,
            }
        ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=4, **style)
    if data.floor is not None:
        ax.axhline(
            data.floor,
            color="tab:red",
            linestyle=":",
            linewidth=1.5,
            label=f"guess floor {data.floor:.1f}%",
        )
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=100, decimals=0))
    xs = {x for xs, _ in data.lines.values() for x in xs}
    if len(xs) == 1:  # one evaluation: a readable axis around it
        ax.set_xlim(min(xs) - 1, max(xs) + 1)
    if data.xlabel == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _legend(fig, ax)
    return fig


def reward_figure(steps: list, values: list, spread: list[Spread]):
    """Mean reward per step (and its EMA) with the saved samples' spread: a band of mean
    +- 1 std clipped to the samples' min..max, or error bars where few steps saved any."""
    fig, ax = _figure("Reward per step", "reward")
    if spread:
        sx = [s.step for s in spread]
        lo = [max(s.low, s.mean - s.std) for s in spread]
        hi = [min(s.high, s.mean + s.std) for s in spread]
        ns = sorted({s.n for s in spread})
        per = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
        label = f"saved samples ({per} per step): mean ± 1 std, within min..max"
        if len(spread) > 2 and len(spread) >= len(steps) / 2:
            ax.fill_between(sx, lo, hi, alpha=0.2, color="tab:green", label=label)
        else:
            ax.errorbar(
                sx,
                [s.mean for s in spread],
                yerr=[
                    [s.mean - a for s, a in zip(spread, lo)],
                    [b - s.mean for s, b in zip(spread, hi)],
                ],
                fmt="s",
                color="tab:green",
                capsize=3,
                label=label,
            )
    if values:
        marker = "o" if len(steps) <= 20 else None
        ax.plot(steps, values, marker=marker, alpha=0.4, label="mean over all samples")
        if len(values) >= 3:
            ax.plot(steps, ema(values), linewidth=2, label="smoothed (EMA 0.8)")
    _legend(fig, ax)
    return fig


def groups_figure(groups: list[Groups], records: list[dict[str, Any]]):
    """The answer groups of a 0/1 reward, in percent of the groups: any answer right and
    every answer right (saved samples), and rewards mixed (all groups, from the metrics'
    ``reward/zero_adv_groups``): the groups GRPO learns from."""
    from matplotlib.ticker import PercentFormatter

    fig, ax = _figure("Answer groups per step (0/1 reward)", "groups")
    if groups:
        ns = sorted({g.n for g in groups})
        per = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
        xs = [g.step for g in groups]
        marker = "o" if len(xs) <= 30 else None
        ax.plot(
            xs,
            [100 * g.any_correct for g in groups],
            marker=marker,
            color="tab:green",
            linewidth=2,
            label=f"any answer right (saved: {per} groups a step)",
        )
        ax.plot(
            xs,
            [100 * g.all_correct for g in groups],
            marker=marker,
            color="tab:blue",
            label="every answer right (saved)",
        )
    steps, zero = series(records, "reward/zero_adv_groups")
    if zero:
        ax.plot(
            steps,
            [100 * (1 - z) for z in zero],
            linestyle="--",
            color="tab:orange",
            label="rewards mixed: a learning signal (all groups)",
        )
    ax.set_ylim(0, 105)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=100, decimals=0))
    _legend(fig, ax)
    return fig


_VISIBLE = 0.01  # a phase under 1% of its step on every step would be a line of no width


def timing_figure(records: list[dict[str, Any]]):
    """Seconds per step, stacked by the phases that ran (time/rollout, time/reward, ...):
    a phase under 1% of the step on every step (the values of a run without a critic,
    timed at 0 or microseconds) is left out of the legend and counted in "other", what
    time/step (the total) holds beyond the phases drawn, itself drawn only when visible."""
    steps = [float(r["step"]) for r in records]
    totals = [number(r.get("time/step")) for r in records]
    found = {k for r in records for k in r if k.startswith("time/") and k != "time/step"}
    column = {k: [number(r.get(k)) or 0.0 for r in records] for k in found}
    whole = [t or sum(col) for t, col in zip(totals, zip(*column.values()))] if found else []
    ran = {k for k, col in column.items() if any(v > _VISIBLE * w for v, w in zip(col, whole))}
    phases = [k for k in _PHASE_ORDER if k in ran] + sorted(ran - set(_PHASE_ORDER))
    if not phases:
        return None
    stacks = [column[k] for k in phases]
    labels = [k.removeprefix("time/") for k in phases]
    covered = [sum(col) for col in zip(*stacks)]
    other = [max(0.0, w - c) for w, c in zip(whole, covered)]
    if any(o > _VISIBLE * w for o, w in zip(other, whole)):
        stacks.append(other)
        labels.append("other")
    fig, ax = _figure("Time per step by phase", "seconds")
    ax.stackplot(steps, *stacks, labels=labels, alpha=0.8)
    _legend(fig, ax)
    return fig


def _histogram(path: Path, dists: dict[str, list]) -> Path:
    fig, ax = _figure("Reward distribution: start vs end", "count", xlabel="reward")
    for label, values in dists.items():
        ax.hist(values, bins=20, alpha=0.5, label=f"{label}, mean {sum(values) / len(values):.3f}")
    _legend(fig, ax)
    return _save(fig, path)


# -------------------------------------------------------------------------------- run


def plot_run(output_dir: Path) -> list[Path]:
    """Write ``OUTPUT/plots/*.png`` and ``OUTPUT/plots/report.html``; returns their paths
    (PNGs first, the report last). Plots without data are left out, never an error."""
    from danka.tools.report import write_report

    output_dir = Path(output_dir)
    rec, findings, note = doctor(output_dir)
    if not rec.metrics:  # a folder the doctor could not read: its metrics all the same
        rec = replace(rec, metrics=read_metrics(output_dir / "metrics.jsonl"))
    records = rec.metrics
    out = output_dir / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    missing: list[str] = []

    def add(name: str, fig) -> None:
        if fig is None:
            missing.append(name)
        else:
            written.append(_save(fig, out / f"{name}.png"))

    def line(name: str, key: str, title: str, ylabel: str) -> None:
        steps, values = series(records, key)
        if values:
            written.append(_line_plot(out / f"{name}.png", title, ylabel, steps, values, True))
        else:
            missing.append(name)

    by_step = accuracy_lines(rec, records)
    add("eval_accuracy", accuracy_figure(by_step, "Held-out accuracy") if by_step.lines else None)
    by_minute = accuracy_lines(rec, records, x="eval/minutes")
    if by_minute.lines:  # runs before eval/minutes have none: no note
        add("eval_accuracy_minutes", accuracy_figure(by_minute, "Held-out accuracy over time"))
    steps, rewards = series(records, "reward")
    zero_one = binary(rec)
    spread = [] if zero_one else reward_spread(rec)  # a 0/1 reward: its groups instead
    add("reward", reward_figure(steps, rewards, spread) if rewards or spread else None)
    if zero_one:
        add("groups", groups_figure(group_outcomes(rec), records))
    line("kl", "kl", "KL to the reference policy", "KL (nats/token)")
    line("entropy", "actor/entropy", "Policy entropy", "nats/token")
    line("response_length", "response_length", "Mean response length", "tokens")
    add("timings", timing_figure(records))
    dists = reward_distributions(rec, records)
    if dists:
        written.append(_histogram(out / "reward_histogram.png", dists))
    else:
        missing.append("reward_histogram")
    verdict = verdict_of(output_dir, rec, findings, note)
    story = (header_of(output_dir, rec, verdict.steps), answer_pairs(rec), probe_drift(rec))
    return [*written, write_report(output_dir, verdict, written, missing, story)]
