"""A learning run, for any config and any reward list: train in a ``danka train``
process, then write one result JSON (and a PNG of the curves) from what the run wrote.

    python -m bench learning examples/reasoning_grpo_smollm2.yaml \
        --out bench/results/reasoning_grpo_result.json [--minutes 7] [key=value ...]
    python -m bench learning --run-dir output/reasoning_grpo --out result.json  # no training

The result: ``before`` / ``after`` (held-out ``accuracy`` by the primary reward function,
``per_function`` accuracies, ``mean_length``, ``truncated``, ``n``, ``step``), every
evaluation, ``guess_floor`` (the run's ``eval/guess_floor``; for runs that did not record
it, computed from the config's held-out rows by danka.diagnose.floors), steps, minutes,
device, versions, the command, the resolved config and ``doctor`` (the danka doctor
findings of the run, danka.diagnose). Nothing here knows a reward function's name.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from danka.io import read_json_lines

FLOOR_KEY = "eval/guess_floor"


def add_run_args(p: argparse.ArgumentParser, out_help: str = "result JSON",
                 minutes_required: bool = True) -> None:  # fmt: skip
    """--minutes, --out, --output-dir and the key=value overrides of a learning run."""
    p.add_argument("--minutes", type=float, required=minutes_required,
                   help="trainer.max_train_minutes (default: the config's)")  # fmt: skip
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--output-dir", default=None, help="the run's folder (default: from --out)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")


def run_paths(args) -> tuple[Path, Path]:
    """(the result file, its folder created; the run's output folder)."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return out, Path(args.output_dir or f"output/{out.stem}")


def parse_train_or_summarize(
    doc: str,
    argv: list[str] | None,
    add_args: Callable[[argparse.ArgumentParser], object] | None = None,
) -> tuple[argparse.Namespace, Path, Path]:
    """The command line of a learning benchmark that trains CONFIG or summarizes the finished
    run in --run-dir (one of the two): (args, the result file, the run's output folder).
    ``add_args`` adds the benchmark's own flags (after CONFIG)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("config", nargs="?", help="training config (omit with --run-dir)")
    if add_args is not None:
        add_args(p)
    p.add_argument("--run-dir", help="summarize this finished run instead of training")
    add_run_args(p, out_help="result JSON (a .png is written beside it)", minutes_required=False)
    args = p.parse_intermixed_args(argv)
    if (args.config is None) == (args.run_dir is None):
        p.error("give a CONFIG to train, or --run-dir DIR to summarize (not both)")
    out, run_dir = run_paths(args)
    return args, out, run_dir


def run_danka_train(
    config: str, minutes: float | None, run_dir: Path, overrides: list[str]
) -> tuple[list[str], int, float]:
    """``danka train CONFIG`` in its own process, time-limited, into ``run_dir``:
    (the command, its exit code, wall seconds)."""
    cmd = [sys.executable, "-m", "danka", "train", config]
    if minutes is not None:
        cmd.append(f"trainer.max_train_minutes={minutes}")
    cmd += ["logging.progress=false", *overrides, "--output-dir", str(run_dir)]
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    rc = subprocess.call(cmd)
    if rc != 0:
        print(f"danka train exited {rc}", flush=True)
    return cmd, rc, time.time() - t0


def write_result(out: Path, cmd: list[str], wall: float, config: dict, fields: dict) -> dict:
    """Write the result JSON of a learning run to ``out`` and return it: the command, date,
    device and library versions, then ``fields`` (the benchmark's own numbers), the wall
    minutes and the run's resolved ``config``."""
    import torch
    import transformers

    result = {
        "command": " ".join(cmd),
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.node(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        **fields,
        "wall_minutes": round(wall / 60, 2),
        "config": config,
    }
    out.write_text(json.dumps(result, indent=2))
    return result


def print_before_after(result: dict, line: Callable[[dict, dict], str]) -> None:
    """Print ``line(before, after)`` when the run was evaluated both before and after."""
    b, a = result.get("before"), result.get("after")
    if b and a:
        print(line(b, a), flush=True)


def eval_summary(data: dict) -> dict:
    """One ``eval/step_N.json`` -> the numbers a result keeps (any reward list)."""
    per_fn = {k[len("eval/correct/"):]: v for k, v in data.items()
              if k.startswith("eval/correct/")}  # fmt: skip
    return {
        "step": data["step"],
        "n": int(data.get("eval/n", 0)),
        "accuracy": data.get("eval/accuracy"),
        "per_function": per_fn,
        "mean_length": data.get("eval/response_length"),
        "truncated": data.get("eval/truncated"),
        **({"guess_floor": data[FLOOR_KEY]} if FLOOR_KEY in data else {}),
    }


def read_evals(run_dir: Path) -> list[dict]:
    files = (run_dir / "eval").glob("step_*.json")
    return sorted((eval_summary(json.loads(f.read_text())) for f in files),
                  key=lambda e: e["step"])  # fmt: skip


def read_metrics(run_dir: Path) -> list[dict]:
    return read_json_lines(run_dir / "metrics.jsonl")  # a cut last line is skipped


def computed_floor(run_dir: Path) -> tuple[float | None, str]:
    """(guess floor, how it was found) for a run that did not record ``eval/guess_floor``:
    the config's held-out rows scored by its own rule rewards (danka.diagnose.floors)."""
    try:
        from bench.lib import danka_side as ds
        from danka.config import load_config
        from danka.diagnose.floors import guess_floors, prompt_text
        from danka.rewards.combine import build_reward_computer

        cfg, base_dir = load_config(str(run_dir / "config.json"), [])
        held = ds.held_out_rows(cfg, Path.cwd(), run_dir)
        if not held:
            return None, "no held-out rows in the config"
        specs = ds.reward_specs(cfg, held)
        with build_reward_computer(specs, base_dir=Path.cwd()) as rewards:
            floors = guess_floors(held, [prompt_text(r) for r in held], rewards)
        return floors.guess_floor, f"computed from the config's {len(held)} held-out rows"
    except Exception as err:  # noqa: BLE001 - a result without a floor beats no result
        return None, f"not computed: {type(err).__name__}: {err}"[:300]


def doctor_findings(run_dir: Path) -> dict:
    """The run's danka doctor findings (danka.diagnose), as in ``danka doctor --json``."""
    from danka.diagnose import diagnose, read_run_dir
    from danka.tools.run_doctor import report_json

    record = read_run_dir(run_dir)
    return report_json(str(run_dir), record, diagnose(record))


def plot_curves(metrics: list[dict], evals: list[dict], floor: float | None, path: Path,
                title: str) -> None:  # fmt: skip
    """Three panels: training reward (total and per term), response length, held-out
    accuracy per function with the guess floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    steps = [m["step"] for m in metrics]
    skip = ("reward/error_rate", "reward/not_applicable", "reward/valid_frac",
            "reward/zero_adv_groups")  # fmt: skip
    keys = ["reward"] + sorted({k for m in metrics for k in m
                                if k.startswith("reward/") and k not in skip})  # fmt: skip
    for key in keys:
        axes[0].plot(steps, [_num(m.get(key)) for m in metrics], label=key)
    axes[0].set_title("training reward per step")
    axes[0].legend(fontsize=8)
    axes[1].plot(steps, [_num(m.get("response_length")) for m in metrics], label="train")
    axes[1].plot([e["step"] for e in evals], [_num(e["mean_length"]) for e in evals],
                 marker="o", label="held-out (greedy)")  # fmt: skip
    axes[1].set_title("mean response length (tokens)")
    axes[1].legend(fontsize=8)
    xs = [e["step"] for e in evals]
    axes[2].plot(xs, [100 * _num(e["accuracy"]) for e in evals], marker="o", label="accuracy")
    for name in sorted({n for e in evals for n in e["per_function"]}):
        ys = [100 * _num(e["per_function"].get(name)) for e in evals]
        axes[2].plot(xs, ys, marker=".", linestyle="--", label=name)
    if floor is not None:
        axes[2].axhline(100 * floor, color="grey", linestyle=":", label="guess floor")
    axes[2].set_title("held-out accuracy, greedy (%)")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) else float("nan")


def summarize_run(run_dir: Path) -> tuple[dict, dict]:
    """(the result's fields, the resolved config) of a finished run folder."""
    config = json.loads((run_dir / "config.json").read_text())
    evals, metrics = read_evals(run_dir), read_metrics(run_dir)
    floor = next((e["guess_floor"] for e in evals if "guess_floor" in e), None)
    source = "eval/guess_floor of the run"
    if floor is None:
        floor, source = computed_floor(run_dir)
    train_seconds = sum(m.get("time/step", 0.0) or 0.0 for m in metrics)
    fields = {
        "before": evals[0] if evals else None,
        "after": evals[-1] if len(evals) > 1 else None,
        "guess_floor": floor,
        "guess_floor_source": source,
        "evaluations": evals,
        "steps": len(metrics),
        "skipped_steps": int(sum(m.get("skipped_step", 0.0) or 0.0 for m in metrics)),
        "train_minutes": round(train_seconds / 60, 2),
        "doctor": doctor_findings(run_dir),
    }
    return fields, config


def before_after_line(result: dict) -> str:
    b, a, floor = result["before"], result["after"], result.get("guess_floor")
    shown = f", guess floor {100 * floor:.1f}%" if floor is not None else ""
    doc = result["doctor"]
    return (
        f"held-out accuracy {100 * b['accuracy']:.1f}% -> {100 * a['accuracy']:.1f}%{shown}; "
        f"length {b['mean_length']:.0f} -> {a['mean_length']:.0f} tokens, truncated "
        f"{100 * b['truncated']:.0f}% -> {100 * a['truncated']:.0f}%; {result['steps']} steps, "
        f"{result['train_minutes']} min; doctor: {doc['problems']} problem(s), "
        f"{doc['risks']} risk(s)"
    )


def run_learning(config: str | None, run_dir: Path, out: Path, minutes: float | None,
                 overrides: list[str]) -> int:  # fmt: skip
    """Train (unless ``config`` is None: ``run_dir`` is read as it is), then write ``out``
    and its PNG. Returns danka train's exit code (0 when nothing was trained)."""
    cmd, rc, wall = ["(existing run)", str(run_dir)], 0, 0.0
    if config is not None:
        cmd, rc, wall = run_danka_train(config, minutes, run_dir, overrides)
        if rc != 0:
            return rc
    fields, resolved = summarize_run(run_dir)
    result = write_result(out, cmd, wall, resolved, fields)
    algo = resolved.get("trainer", {}).get("algorithm", "?")
    plot_curves(read_metrics(run_dir), fields["evaluations"], fields["guess_floor"],
                out.with_suffix(".png"), f"{algo}: {out.stem}")  # fmt: skip
    print_before_after(result, lambda b, a: before_after_line(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args, out, run_dir = parse_train_or_summarize(__doc__, argv)
    if args.run_dir:
        return run_learning(None, Path(args.run_dir), out, None, [])
    return run_learning(args.config, run_dir, out, args.minutes, args.overrides)
