"""Calculator-tool learning run: train examples/calculator_tool.yaml for a few minutes, and
write one result JSON with the held-out accuracy WITH the tool before and after training,
greedy AND sampled, the valid-call rates before and after, and the per-step training curve.

    python -m bench calc-learning examples/calculator_tool.yaml --minutes 6 \\
        --out bench/results/calc_tool_learning_h200.json [--eval-samples 4] [key=value ...]

Why sampled: with the worked examples (``agent.tool_demo: auto``) the untrained model
already answers every held-out problem greedily (100%), so greedy accuracy cannot move;
what training changes is the sampled policy. ``sampled_before`` / ``sampled_after``: K
answers per held-out problem at the training temperature (``trainer.temperature``, top-p
1) from the base model and from the run's last checkpoint, through the same agent loop
and reward (``bench.learning.calc_tool_heldout.measure``): mean accuracy (= pass@1) and the
valid-call rates.

The training runs in its own ``danka train`` process (what a user runs); this script only
reads what that run wrote: ``eval/step_N.json`` (greedy, through the agent loop: the
``eval/agent/*`` metrics), ``metrics.jsonl`` and ``config.json``; a few trajectories of
the last evaluation (tool turns included) go into the result too. The evaluation before
training is the one at step 0, the one after is the run's last (``trainer.eval_steps``
and the final step).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.learning.calc_tool_heldout import load_policy, measure, without_example
from bench.learning.learning import (
    add_run_args,
    print_before_after,
    run_danka_train,
    run_paths,
    write_result,
)
from bench.lib.common import parser

AGENT_KEYS = {
    "valid_call_samples": "eval/agent/valid_call_samples",  # share of answers with a valid call
    "valid_call_rate": "eval/agent/valid_call_rate",  # valid calls / attempted calls
    "tool_calls": "eval/agent/tool_calls",  # calls per answer
    "turns": "eval/agent/turns",
}
TRAIN_KEYS = (
    "reward",
    "agent/valid_call_samples",
    "agent/valid_call_rate",
    "agent/tool_calls",
    "agent/prefill_tokens",  # per sample; with agent.kv_reuse most of the prefix is reused
    "agent/reused_tokens",
    "time/rollout",
)


def eval_summary(data: dict) -> dict:
    """One ``eval/step_N.json`` -> accuracy and tool use (None where not logged)."""
    out = {"step": data["step"], "n": int(data["eval/n"]), "accuracy": data["eval/accuracy"]}
    out.update({name: data.get(key) for name, key in AGENT_KEYS.items()})
    out["mean_length"] = data.get("eval/response_length")
    return out


def summarize_run(run_dir: Path) -> dict:
    """Before/after evaluations, the training curve and example trajectories of a run."""
    raw = sorted(
        (json.loads(f.read_text()) for f in (run_dir / "eval").glob("step_*.json")),
        key=lambda d: d["step"],
    )
    evals = [eval_summary(d) for d in raw]
    metrics = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line
    ]
    curve = [{"step": m["step"], **{k: m.get(k) for k in TRAIN_KEYS}} for m in metrics]
    return {
        "before": evals[0] if evals else None,
        "after": evals[-1] if evals else None,
        "evaluations": evals,
        "train_curve": curve,
        "steps": len(metrics),
        "train_minutes": round(sum(m.get("time/step", 0.0) for m in metrics) / 60, 2),
        "example_trajectories": (raw[-1].get("samples") or [])[:4] if raw else [],
    }


def sampled_before_after(args, run_dir: Path) -> dict:
    """Held-out accuracy at the training temperature, ``args.eval_samples`` answers per
    problem (the first ``args.eval_n``; all by default), before (the config's model) and
    after (the run's newest complete checkpoint)."""
    from bench.lib.danka_side import held_out_rows
    from danka.checkpoint import checkpoint_parts, find_latest_checkpoint
    from danka.config import load_config

    cfg, base_dir = load_config(args.config, args.overrides)
    held = held_out_rows(cfg, base_dir, run_dir)
    rows = held[: args.eval_n] if args.eval_n else held
    state = find_latest_checkpoint(run_dir)
    if not rows or state is None:
        return {"sampled_skipped": "no held-out rows" if not rows else "no checkpoint"}
    out = {}
    for name, weights in (("before", None), ("after", str(checkpoint_parts(state)["actor"]))):
        model, tok = load_policy(cfg, weights)
        k, temp = args.eval_samples, cfg.sampling.temperature
        got = measure(model, tok, cfg, base_dir, rows, k, temp, batch=args.eval_batch)
        out[f"sampled_{name}"] = {"weights": weights or cfg.model.actor_model_name_or_path, **got}
        print(json.dumps({f"sampled_{name}": without_example(got)}), flush=True)
        del model
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser("calc-learning", __doc__)
    p.add_argument("config", help="examples/calculator_tool.yaml")
    add_run_args(p)
    p.add_argument(
        "--eval-samples",
        type=int,
        default=4,
        help="sampled answers per held-out "
        "problem before/after at trainer.temperature (0: greedy only)",
    )
    p.add_argument("--eval-n", type=int, default=None, help="held-out problems (default: all)")
    p.add_argument("--eval-batch", type=int, default=512, help="sequences per generate call")
    args = p.parse_intermixed_args(argv)
    out, run_dir = run_paths(args)
    cmd, rc, wall = run_danka_train(args.config, args.minutes, run_dir, args.overrides)
    if rc != 0:
        return rc
    config = json.loads((run_dir / "config.json").read_text())
    fields = summarize_run(run_dir)
    if args.eval_samples > 1:
        fields.update(sampled_before_after(args, run_dir))
    result = write_result(out, cmd, wall, config, fields)
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    print_before_after(
        result,
        lambda b, a: (
            f"held-out accuracy with the tool {pct(b['accuracy'])} -> {pct(a['accuracy'])}, "
            f"answers with a valid call {pct(b['valid_call_samples'])} -> "
            f"{pct(a['valid_call_samples'])}, valid-call rate {pct(b['valid_call_rate'])} -> "
            f"{pct(a['valid_call_rate'])}, {result['steps']} steps, "
            f"{result['train_minutes']} min ({out})"
        ),
    )
    b, a = result.get("sampled_before"), result.get("sampled_after")
    if b and a:
        print(
            f"held-out SAMPLED (T={a['temperature']:g}, {a['samples']} per problem, "
            f"{a['n']} problems): accuracy {pct(b['accuracy'])} -> {pct(a['accuracy'])}, "
            f"answers with a valid call {pct(b['valid_call_samples'])} -> "
            f"{pct(a['valid_call_samples'])}, valid-call rate {pct(b['valid_call_rate'])} -> "
            f"{pct(a['valid_call_rate'])}"
        )
    return 0
