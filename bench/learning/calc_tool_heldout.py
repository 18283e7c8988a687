"""Held-out accuracy of a model with the calculator tool, greedy AND sampled, on the
example's problems and on harder splits: which held-out number can still move in training?

With ``agent.tool_demo: auto`` the untrained SmolLM2-135M-Instruct already answers every
held-out problem greedily (BENCHMARKS.md, "Calculator tool"), so greedy
accuracy cannot show learning. This measures, per split, greedy accuracy (1 answer) and
sampled accuracy at the training temperature (``--samples K`` answers per problem: mean
accuracy = pass@1, and the valid-call rates), with examples/calculator_tool.yaml's tool
settings (prompt, worked examples, turns, token budgets, reward)::

    OMP_NUM_THREADS=2 python -m bench calc-heldout examples/calculator_tool.yaml \\
        --n 32 --samples 4 --split default --split digits5x4 --split two_ops \\
        --out bench/results/calc_tool_heldout_cpu.json [--model DIR] [key=value ...]

Splits (all drawn from the test half of the task: ``calc_split`` holds the pair out):
``default`` the example's (4-digit x 3-digit products and exact divisions); ``digits5x4``
the same with a 5-digit and a 4-digit number; ``two_ops`` ``a * b + c`` / ``a * b - c``
(4-, 3-, 4-digit), one expression the calculator evaluates in one call.
"""

from __future__ import annotations

import json
import os
import platform
import random
import time
from pathlib import Path

import torch

from bench.lib.common import parser

SPLITS = ("default", "digits5x4", "two_ops")


def split_rows(name: str, n: int, seed: int = 0) -> list:
    """``n`` held-out problems of split ``name`` (see the module docstring)."""
    from danka.data.calc_task import CALC_SOURCE, calc_rows, calc_split
    from danka.types import PromptRow

    if name == "default":
        return calc_rows(n, seed=seed, split="test")
    if name == "digits5x4":
        return calc_rows(n, seed=seed, split="test", a_range=(10000, 99999), b_range=(1000, 9999))
    if name != "two_ops":
        raise SystemExit(f"unknown split {name!r}: one of {', '.join(SPLITS)}")
    rng, rows = random.Random(f"{seed}:two_ops"), []
    while len(rows) < n:
        a, b, c = rng.randint(1000, 9999), rng.randint(100, 999), rng.randint(1000, 9999)
        if calc_split(a, b) != "test":
            continue
        op = rng.choice("+-")
        rows.append(
            PromptRow(
                index=len(rows),
                prompt=f"What is {a} * {b} {op} {c}?",
                ground_truth=str(a * b + c if op == "+" else a * b - c),
                data_source=CALC_SOURCE,
            )
        )
    return rows


def load_policy(cfg, weights: str | None = None):
    """(model, tokenizer) for evaluation: the tokenizer of the config's model; the weights
    of ``weights`` (a full-model checkpoint dir, or a LoRA adapter dir applied to the
    config's model), else of the config's model. bf16 on a GPU, fp32 on the CPU."""
    from peft import PeftModel

    from danka.models.loading import load_causal_lm, load_tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    quiet = lambda *_: None  # noqa: E731
    base = cfg.model.actor_model_name_or_path
    adapter = weights is not None and (Path(weights) / "adapter_config.json").is_file()
    tok = load_tokenizer(base, log=quiet)
    model = load_causal_lm(
        base if adapter or weights is None else weights, dtype=dtype, device=device, log=quiet
    )
    if adapter:
        model = PeftModel.from_pretrained(model, weights)
    return model.eval(), tok


def measure(
    model, tok, cfg, base_dir, rows, samples: int, temperature: float, batch: int = 512
) -> dict:
    """Accuracy and tool use over ``rows`` through the config's agent loop and reward
    (danka eval's code path): greedy for ``samples == 1``, else ``samples`` answers per
    row at ``temperature`` (accuracy = the mean over all answers = pass@1)."""
    from bench.lib.danka_side import reward_specs
    from danka.rewards.combine import build_reward_computer
    from danka.tools.evaluate import evaluate_rows

    t0 = time.time()
    with build_reward_computer(reward_specs(cfg, rows), base_dir=base_dir) as rewards:
        res = evaluate_rows(
            model,
            tok,
            rows,
            rewards,
            samples=samples,
            temperature=0.0 if samples == 1 else temperature,
            max_new_tokens=cfg.trainer.max_new_tokens,
            system=cfg.data.system_prompt,
            instruction=cfg.data.instruction,
            batch_size=batch,
            tools=cfg.agent,
            base_dir=base_dir,
        )
    keys = ("agent/valid_call_samples", "agent/valid_call_rate", "agent/tool_calls")
    return {
        "n": len(rows),
        "samples": samples,
        "temperature": 0.0 if samples == 1 else temperature,
        "accuracy": res["accuracy"],
        **{k.split("/")[1]: res.get(k) for k in keys},
        "truncation_rate": res["truncation_rate"],
        "seconds": round(time.time() - t0, 1),
        "example": res["completions"][0].get("messages"),
    }


def main(argv: list[str] | None = None) -> int:
    from danka.config import load_config

    ap = parser("calc-heldout", __doc__)
    ap.add_argument("config", help="examples/calculator_tool.yaml")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    ap.add_argument("--model", help="checkpoint dir: full model or LoRA adapter (default: base)")
    ap.add_argument("--n", type=int, default=32, help="held-out problems per split")
    ap.add_argument("--samples", type=int, default=4, help="sampled answers per problem")
    ap.add_argument("--split", action="append", help=f"one of {SPLITS} (repeatable)")
    ap.add_argument("--no-greedy", action="store_true", help="sampled only")
    ap.add_argument("--out", help="result JSON")
    args = ap.parse_args(argv)
    cfg, base_dir = load_config(args.config, args.overrides)
    model, tok = load_policy(cfg, args.model)
    device = next(model.parameters()).device
    result = {
        "what": "held-out accuracy with the calculator tool, greedy and sampled",
        "model": args.model or cfg.model.actor_model_name_or_path,
        "config": args.config,
        "overrides": args.overrides,
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0)
        if device.type == "cuda"
        else f"CPU ({platform.machine()}), {torch.get_num_threads()} threads, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "splits": {},
    }
    for split in args.split or ["default"]:
        rows = split_rows(split, args.n)
        runs = [] if args.no_greedy else [1]
        runs += [args.samples] if args.samples > 1 else []
        result["splits"][split] = out = {}
        for k in runs:
            row = measure(model, tok, cfg, base_dir, rows, k, cfg.sampling.temperature)
            out["greedy" if k == 1 else "sampled"] = row
            print(json.dumps({"split": split, **without_example(row)}), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)
    return 0


def without_example(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "example"}
