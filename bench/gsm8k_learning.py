"""GSM8K learning run: bench/learning.py with the GSM8K files as data, plus the GSM8K
names of the accuracies (``strict`` / ``flexible`` / ``format``) where the reward list
has those functions.

    python bench/gsm8k_learning.py examples/gsm8k_grpo_smollm2.yaml \
        --train PATH/train.jsonl --test PATH/test.jsonl --minutes 7 \
        --out bench/results/gsm8k_grpo_result.json [key=value ...]

Everything else (before/after accuracy by the primary function, per-function accuracies,
lengths, truncation, the guess floor, the doctor's findings, the PNG) is learning.py's.
The helpers other benchmarks import from here (add_run_args, run_danka_train, ...) live
in learning.py and are re-exported.
"""

from __future__ import annotations

import argparse
import json
import sys

from learning import (  # noqa: F401 - bench/: this folder; re-exported for other benchmarks
    add_run_args,
    print_before_after,
    run_danka_train,
    run_learning,
    run_paths,
    write_result,
)


def reward_roles(config: dict) -> dict[str, str]:
    """role (strict / flexible / format) -> the function's name in ``per_function``.

    The combiner names repeated functions ``name``, ``name_2``, ... in config order."""
    seen: dict[str, int] = {}
    roles: dict[str, str] = {}
    for fn in config["reward"]["functions"]:
        name = fn["name"]
        seen[name] = seen.get(name, 0) + 1
        key = name if seen[name] == 1 else f"{name}_{seen[name]}"
        kwargs = fn.get("kwargs") or {}
        role = kwargs.get("method", "strict") if name == "gsm8k" else name
        if role in ("strict", "flexible", "lenient", "format"):
            roles.setdefault(role, key)
    return roles


def add_roles(result: dict) -> dict:
    """``before`` / ``after`` / each evaluation also under the GSM8K role names."""
    roles = reward_roles(result["config"])
    for e in [result.get("before"), result.get("after"), *result.get("evaluations", [])]:
        if e:
            e.update({role: e["per_function"].get(key) for role, key in roles.items()})
    return result


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
    rc = run_learning(args.config, run_dir, out, args.minutes, overrides)
    if rc == 0:
        out.write_text(json.dumps(add_roles(json.loads(out.read_text())), indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
