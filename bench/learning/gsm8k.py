"""GSM8K time-to-accuracy: a ``danka train`` run on a real model, summarised against
verl's published PPO curve on the same model size.

    python -m bench gsm8k examples/gsm8k_ppo.yaml --model qwen2.5-coder-0.5b-instruct.gguf \\
        --out bench/results/gsm8k_qwen05_ppo.json [--minutes 20] [key=value ...]
    python -m bench gsm8k --run-dir output/gsm8k_ppo --model FILE --out result.json

The config's reward list names its terms ``strict`` (verl's "####" answer, trained),
``flexible`` (the last number), ``boxed`` (the last ``\\boxed{}``) and ``format`` (an
answer after "####" at all) through ``label``. The result holds ``model`` (file name,
bytes, sha256), ``n``, ``before`` / ``after`` (each metric, mean length, truncation),
``curve`` (every evaluation with its wall-clock minute since ``danka train`` started;
the middle ones may use ``eval.subset_size`` prompts, ``n`` says), ``wall_minutes`` (to
the end of the final evaluation), ``minutes_to`` (the first minute at 30 / 33 / 36 / 38%
strict), ``milestones`` (minutes to verl's strict accuracies and the ratio to verl's
minutes), ``peak_gib``, seconds per phase, ``doctor``, ``goals``
(pass or miss, each with its numbers), the command, the resolved config and versions;
a PNG of the curve with verl's points beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

from bench.learning.learning import (
    doctor_findings,
    parse_train_or_summarize,
    read_evals,
    read_metrics,
    run_danka_train,
    write_result,
)
from bench.lib.gsm8k_data import METRICS, VERL_PPO, first_at, milestones, minutes_to

# issue 47: strict 33% within 4 minutes; 38% within 20; flexible + 10 points; <= 24 GiB
FAST_STRICT, FAST_MINUTES, GOAL_STRICT, GOAL_MINUTES = 0.33, 4.0, 0.38, 20.0
FLEX_GAIN, GOAL_GIB = 0.10, 24.0


def file_identity(path: Path) -> dict:
    """File name, size and sha256 (read in 8 MiB blocks)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def point(ev: dict, raw: dict) -> dict:
    """One evaluation: each labelled metric, length, truncation, n, step, minute."""
    per = ev["per_function"]
    return {
        "step": ev["step"],
        "minute": raw.get("eval/minutes"),
        "n": ev["n"],
        **{m: per.get(m) for m in METRICS},
        "mean_length": ev["mean_length"],
        "truncated": ev["truncated"],
        "seconds": raw.get("eval/seconds"),
    }


def goals(curve: list[dict], wall: float | None, peak: float | None, doctor: dict) -> dict:
    """The time-to-accuracy issue's goals for one algorithm, each with its numbers: strict
    33% (the first recipes' plateau) within 4 minutes; strict >= 38% at the final
    evaluation, within 20 minutes; flexible >= the base's + 10 points (the answers got
    better, not only their format); mean answer >= half the base's; no doctor problem; peak
    <= 24 GiB. The moonshot, strict >= base flexible + 15 points, is reported beside them."""
    before, after = curve[0], curve[-1]
    base_flex = before["flexible"] or 0.0
    fast = (first_at(curve, FAST_STRICT) or {}).get("minute")
    checks = {
        "fast": fast is not None and fast <= FAST_MINUTES,
        "strict": (after["strict"] or 0.0) >= GOAL_STRICT,
        "minutes": wall is not None and wall <= GOAL_MINUTES,
        "flexible": (after["flexible"] or 0.0) >= base_flex + FLEX_GAIN,
        "length": after["mean_length"] >= 0.5 * before["mean_length"],
        "doctor": doctor.get("problems", 1) == 0,
        "memory": peak is not None and peak <= GOAL_GIB,
    }
    return {
        "strict_target": GOAL_STRICT,
        "fast_target": {"strict": FAST_STRICT, "minutes": FAST_MINUTES, "reached_at": fast},
        "flexible_target": round(base_flex + FLEX_GAIN, 4),
        "moonshot": {
            "strict": round(base_flex + 0.15, 4),
            "met": (after["strict"] or 0.0) >= base_flex + 0.15,
        },
        "met": {k: bool(v) for k, v in checks.items()},
        "all_met": all(checks.values()),
    }


def phase_seconds(metrics: list[dict]) -> dict:
    """Seconds per phase summed over the steps (``time/<phase>``)."""
    total: dict[str, float] = {}
    for m in metrics:
        for k, v in m.items():
            if k.startswith("time/") and isinstance(v, (int, float)) and math.isfinite(v):
                total[k[5:]] = total.get(k[5:], 0.0) + v
    return {k: round(v, 1) for k, v in sorted(total.items())}


def summarize(run_dir: Path) -> tuple[dict, dict]:
    """(the result's fields, the resolved config) of a finished GSM8K run folder."""
    config = json.loads((run_dir / "config.json").read_text())
    evals, metrics = read_evals(run_dir), read_metrics(run_dir)
    raw = {e["step"]: json.loads((run_dir / "eval" / f"step_{e['step']}.json").read_text())
           for e in evals}  # fmt: skip
    curve = [point(e, raw[e["step"]]) for e in evals]
    if len(curve) < 2:
        raise SystemExit(f"{run_dir}: fewer than two evaluations, nothing to compare")
    before, after = curve[0], curve[-1]
    peaks = [m["memory/peak_gib"] for m in metrics if "memory/peak_gib" in m]
    peak = round(max(peaks), 2) if peaks else None
    doctor = doctor_findings(run_dir)
    wall = after["minute"]
    fields = {
        "n": before["n"],
        "guess_floor": raw[evals[0]["step"]].get("eval/guess_floor"),
        "before": before,
        "after": after,
        "curve": curve,
        "wall_minutes_to_final_eval": wall,
        "minutes_to": minutes_to(curve),
        "milestones": milestones(curve),
        "peak_gib": peak,
        "steps": len(metrics),
        "skipped_steps": int(sum(m.get("skipped_step", 0.0) or 0.0 for m in metrics)),
        "phase_seconds": phase_seconds(metrics),
        "eval_seconds": round(sum(p["seconds"] or 0.0 for p in curve), 1),
        "doctor": doctor,
        "goals": goals(curve, wall, peak, doctor),
    }
    return fields, config


def plot(result: dict, path: Path, title: str) -> None:
    """Strict and flexible accuracy against wall-clock minutes (log scale), verl's PPO
    points beside them, the guess floor as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    curve = [p for p in result["curve"] if p["minute"]]
    xs = [p["minute"] for p in curve]
    for metric, style in (("strict", "o-"), ("flexible", "s--"), ("boxed", ".:")):
        ax.plot(xs, [100 * (p[metric] or 0.0) for p in curve], style, label=f"danka {metric}")
    vx, vy = zip(*((m, 100 * a) for a, m in VERL_PPO))
    ax.plot(vx, vy, "k^", markersize=9, label="verl PPO strict (Qwen2.5-0.5B-Instruct)")
    if result.get("guess_floor") is not None:
        ax.axhline(100 * result["guess_floor"], color="grey", linestyle=":", label="guess floor")
    ax.axvline(GOAL_MINUTES, color="red", alpha=0.3, label="20 minutes")
    ax.set_xscale("log")
    ax.set_xlabel("minutes since `danka train` started (log scale)")
    ax.set_ylabel("GSM8K test accuracy, greedy (%)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def verdict_line(result: dict) -> str:
    b, a, g = result["before"], result["after"], result["goals"]
    missed = [k for k, ok in g["met"].items() if not ok]
    at = g["fast_target"]["reached_at"]
    fast = "33% not reached" if at is None else f"33% at {at} min"
    return (
        f"strict {100 * b['strict']:.1f}% -> {100 * a['strict']:.1f}% ({fast}; target "
        f"{100 * g['strict_target']:.1f}%), flexible {100 * b['flexible']:.1f}% -> "
        f"{100 * a['flexible']:.1f}%, boxed {100 * (b['boxed'] or 0):.1f}% -> "
        f"{100 * (a['boxed'] or 0):.1f}%, {b['mean_length']:.0f} -> {a['mean_length']:.0f} "
        f"tokens, {result['wall_minutes_to_final_eval']} min, peak {result['peak_gib']} GiB; "
        f"goals {'all met' if g['all_met'] else 'missed: ' + ', '.join(missed)}"
    )


def main(argv: list[str] | None = None) -> int:
    def model_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", required=True, help="the model file (.gguf) or folder trained")

    args, out, run_dir = parse_train_or_summarize(__doc__, argv, model_arg)
    model = Path(args.model)
    cmd, wall = ["(existing run)", str(args.run_dir)], 0.0
    if args.config is not None:
        overrides = [f"model.actor_model_name_or_path={model}", *args.overrides]
        cmd, rc, wall = run_danka_train(args.config, args.minutes, run_dir, overrides)
        if rc != 0:
            return rc
    else:
        run_dir = Path(args.run_dir)
    fields, config = summarize(run_dir)
    model_id = file_identity(model) if model.is_file() else {"folder": str(model)}
    result = write_result(out, cmd, wall, config, {"model": model_id, **fields})
    algo = config.get("trainer", {}).get("algorithm", "?")
    plot(result, out.with_suffix(".png"), f"GSM8K, {model.name}, {algo}")
    print(verdict_line(result), flush=True)
    return 0
