"""GSM8K learning run on one GPU: train with a config, evaluate all test questions greedy
before and after, write one result JSON (both evaluations, timings, the resolved config)
and a PNG of the curves.

    python bench/gsm8k_learning.py examples/gsm8k_grpo_smollm2.yaml \
        --train PATH/train.jsonl --test PATH/test.jsonl --minutes 7 \
        --out bench/results/gsm8k_grpo_result.json [key=value ...]

The training runs in its own ``danka train`` process (what a user runs); this script only
reads what that run wrote: ``eval/step_N.json`` (greedy evaluation of every test question,
per reward function), ``metrics.jsonl`` (one line per step) and ``config.json``. Which
evaluation key is "strict", "flexible" and "format" is read from the run's reward list
(``reward.functions``: gsm8k with method strict / flexible, format), in config order.
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


def _reward_roles(config: dict) -> dict[str, str]:
    """role (strict / flexible / format) -> the ``eval/correct/<name>`` key of that function.

    The combiner names repeated functions ``name``, ``name_2``, ... in config order."""
    seen: dict[str, int] = {}
    roles: dict[str, str] = {}
    for fn in config["reward"]["functions"]:
        name = fn["name"]
        seen[name] = seen.get(name, 0) + 1
        key = name if seen[name] == 1 else f"{name}_{seen[name]}"
        kwargs = fn.get("kwargs") or {}
        if name == "gsm8k":
            role = kwargs.get("method", "strict")
        elif name == "format":
            role = "format"
        else:
            continue
        roles.setdefault(role, f"eval/correct/{key}")
    return roles


def _eval_summary(path: Path, roles: dict[str, str]) -> dict:
    data = json.loads(path.read_text())
    out = {role: data.get(key) for role, key in roles.items()}
    out.update(
        step=data["step"],
        n=int(data["eval/n"]),
        mean_length=data.get("eval/response_length"),
        truncated=data.get("eval/truncated"),
    )
    return out


def _plot(metrics: list[dict], evals: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    steps = [m["step"] for m in metrics]
    for key in ("reward", "reward/gsm8k", "reward/format"):
        if any(key in m for m in metrics):
            axes[0].plot(steps, [m.get(key, float("nan")) for m in metrics], label=key)
    axes[0].set_title("training reward per step")
    axes[0].legend()
    axes[1].plot(steps, [m.get("response_length", float("nan")) for m in metrics])
    axes[1].set_title("mean response length (tokens)")
    for role in ("strict", "flexible", "format"):
        xs = [e["step"] for e in evals if e.get(role) is not None]
        ys = [100 * e[role] for e in evals if e.get(role) is not None]
        if xs:
            axes[2].plot(xs, ys, marker="o", label=role)
    axes[2].set_title("held-out accuracy, all test questions, greedy (%)")
    axes[2].legend()
    for ax in axes:
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def add_run_args(p: argparse.ArgumentParser, out_help: str = "result JSON") -> None:
    """--minutes, --out, --output-dir and the key=value overrides of a learning run."""
    p.add_argument("--minutes", type=float, required=True, help="trainer.max_train_minutes")
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--output-dir", default=None, help="the run's folder (default: from --out)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")


def run_paths(args) -> tuple[Path, Path]:
    """(the result file, its folder created; the run's output folder)."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return out, Path(args.output_dir or f"output/{out.stem}")


def run_danka_train(
    config: str, minutes: float, run_dir: Path, overrides: list[str]
) -> tuple[list[str], int, float]:
    """``danka train CONFIG`` in its own process, time-limited, into ``run_dir``:
    (the command, its exit code, wall seconds)."""
    cmd = [sys.executable, "-m", "danka", "train", config]
    cmd += [f"trainer.max_train_minutes={minutes}", "logging.progress=false", *overrides]
    cmd += ["--output-dir", str(run_dir)]
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
    b, a = result["before"], result["after"]
    if b and a:
        print(line(b, a), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("config")
    p.add_argument("--train", required=True, help="GSM8K train.jsonl")
    p.add_argument("--test", required=True, help="GSM8K test.jsonl (all rows are evaluated)")
    add_run_args(p, out_help="result JSON (a .png is written beside it)")
    args = p.parse_intermixed_args(argv)
    out, run_dir = run_paths(args)
    overrides = [f"data.train_dataset={args.train}", f"data.eval_dataset={args.test}"]
    overrides += ["data.eval_size=0", *args.overrides]
    cmd, rc, wall = run_danka_train(args.config, args.minutes, run_dir, overrides)
    if rc != 0:
        return rc
    config = json.loads((run_dir / "config.json").read_text())
    roles = _reward_roles(config)
    evals = sorted(
        (_eval_summary(f, roles) for f in (run_dir / "eval").glob("step_*.json")),
        key=lambda e: e["step"],
    )
    metrics = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line
    ]
    train_seconds = sum(m.get("time/step", 0.0) for m in metrics)
    fields = {
        "before": evals[0] if evals else None,
        "after": evals[-1] if evals else None,
        "evaluations": evals,
        "steps": len(metrics),
        "skipped_steps": int(sum(m.get("skipped_step", 0.0) for m in metrics)),
        "train_minutes": round(train_seconds / 60, 2),
    }
    result = write_result(out, cmd, wall, config, fields)
    title = f"{config['trainer']['algorithm']} on GSM8K ({out.stem})"
    _plot(metrics, evals, out.with_suffix(".png"), title)
    print_before_after(
        result,
        lambda b, a: (
            f"strict {100 * b['strict']:.2f}% -> {100 * a['strict']:.2f}%, "
            f"flexible {100 * b['flexible']:.2f}% -> {100 * a['flexible']:.2f}%, "
            f"format {100 * b['format']:.1f}% -> {100 * a['format']:.1f}%, "
            f"length {b['mean_length']:.0f} -> {a['mean_length']:.0f}, "
            f"{result['steps']} steps, {result['skipped_steps']} skipped, "
            f"{result['train_minutes']} min"
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
