"""Does a reward model track correctness? Read an RL run trained on a reward model with a
rule reward logged beside it (weight 0), and compare the two sample by sample.

    python -m bench rm-tracking OUTPUT_DIR --out bench/results/rl_with_rm.json \
        [--rule gsm8k] [--command "..."] [--device "..."]

Reads ``OUTPUT_DIR/completions/step_N.jsonl`` (``logging.save_completions`` >= the samples
of a step gives every sample; each line holds ``rewards: {reward_model, <rule>}``) and
``metrics.jsonl``. Per step and pooled over the run:

- ``pearson``: the correlation of the RM score with the rule reward (None when either is
  constant, e.g. no correct answer in the step);
- ``auc``: P(rm(correct) > rm(wrong)) over all (correct, wrong) pairs of samples, ties
  count 1/2 (the RM's pairwise accuracy on the policy's own answers; 0.5 = chance);
- ``auc_within_prompt``: the same over pairs answering the SAME prompt, what GRPO's
  group-relative advantage actually uses.

A sample is "correct" when its rule reward is >= ``--correct-at`` (1.0: verl's strict score).
``pooled_with_marker`` repeats the pooled statistics over the samples whose completion
contains ``--marker`` ("####": answers that reached a final answer), separating "the RM
prefers correct answers" from "the RM prefers finished, well-formatted ones".
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from bench.lib.common import parser


def pearson(x: list[float], y: list[float]) -> float | None:
    """Pearson correlation of two equal-length lists; None if either has zero variance."""
    n = len(x)
    if n < 2 or len(y) != n:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def ranking_auc(pos: list[float], neg: list[float]) -> tuple[float | None, int]:
    """(P(p > n) + P(p == n) / 2 over every pair (p in pos, n in neg), number of pairs);
    (None, 0) when either side is empty."""
    pairs = len(pos) * len(neg)
    if not pairs:
        return None, 0
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / pairs, pairs


def _auc_within(samples: list[dict], correct_at: float) -> tuple[float | None, int]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        groups[json.dumps(s["prompt"])].append(s)
    wins = pairs = 0.0
    for group in groups.values():
        pos = [s["rm"] for s in group if s["rule"] >= correct_at]
        neg = [s["rm"] for s in group if s["rule"] < correct_at]
        auc, n = ranking_auc(pos, neg)
        if n:
            wins, pairs = wins + auc * n, pairs + n
    return (wins / pairs if pairs else None), int(pairs)


def summarize(samples: list[dict], correct_at: float = 1.0) -> dict:
    """Statistics of samples ``{"rm": float, "rule": float, "prompt": ...}``."""
    rm, rule = [s["rm"] for s in samples], [s["rule"] for s in samples]
    pos = [s["rm"] for s in samples if s["rule"] >= correct_at]
    neg = [s["rm"] for s in samples if s["rule"] < correct_at]
    auc, n_pairs = ranking_auc(pos, neg)
    within, n_within = _auc_within(samples, correct_at)
    mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
    return {
        "n": len(samples),
        "correct": len(pos),
        "rule_mean": mean(rule),
        "rm_mean": mean(rm),
        "rm_mean_correct": mean(pos),
        "rm_mean_wrong": mean(neg),
        "pearson": pearson(rm, rule),
        "auc": auc,
        "auc_pairs": n_pairs,
        "auc_within_prompt": within,
        "auc_within_prompt_pairs": n_within,
    }


def read_samples(output_dir: Path, rule: str) -> dict[int, list[dict]]:
    """step -> samples from ``completions/step_N.jsonl``."""
    steps = {}
    for path in sorted((output_dir / "completions").glob("step_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
        samples = []
        for row in rows:
            parts = row["rewards"]
            if "reward_model" not in parts or rule not in parts:
                raise SystemExit(f"{path}: needs rewards 'reward_model' and {rule!r}, got {parts}")
            samples.append(
                {"rm": parts["reward_model"], "rule": parts[rule], "prompt": row["prompt"],
                 "completion": row["completion"]}
            )  # fmt: skip
        steps[int(path.stem.split("_")[1])] = samples
    if not steps:
        raise SystemExit(f"no completions/step_*.jsonl under {output_dir}")
    return dict(sorted(steps.items()))


def main(argv: list[str] | None = None) -> int:
    ap = parser("rm-tracking", __doc__)
    ap.add_argument("output_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rule", default="gsm8k", help="the logged rule reward's name")
    ap.add_argument("--correct-at", type=float, default=1.0)
    ap.add_argument("--marker", default="####", help="see pooled_with_marker")
    ap.add_argument("--command", default=None, help="the training command, recorded")
    ap.add_argument("--device", default=None, help="where it ran, recorded")
    ap.add_argument("--date", default=None)
    args = ap.parse_args(argv)
    steps = read_samples(args.output_dir, args.rule)
    per_step = [{"step": k, **summarize(v, args.correct_at)} for k, v in steps.items()]
    every = [s for v in steps.values() for s in v]
    pooled = summarize(every, args.correct_at)
    marked = [s for s in every if args.marker in s["completion"]]
    metrics = args.output_dir / "metrics.jsonl"
    evals = sorted((args.output_dir / "eval").glob("step_*.json"))
    result = {
        "output_dir": str(args.output_dir),
        "rule": args.rule,
        "command": args.command,
        "device": args.device,
        "date": args.date,
        "pooled": pooled,
        "marker": args.marker,
        "pooled_with_marker": summarize(marked, args.correct_at),
        "rm_mean_without_marker": (
            sum(s["rm"] for s in every if args.marker not in s["completion"])
            / max(1, len(every) - len(marked))
        ),
        "per_step": per_step,
        "train_steps": sum(1 for _ in metrics.open()) if metrics.exists() else None,
        "eval": [
            {k: v for k, v in json.loads(p.read_text()).items() if k != "samples"} for p in evals
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(pooled, indent=2))
    return 0
