"""Base-model accuracy of candidate reasoning tasks, next to each task's guess floor.

For the reasoning example, a task must leave headroom: the base model's greedy accuracy
clearly above the guess floor (what a constant answer scores) and below ~50%, with
answers that actually reason (mean length well above a bare number).

    python -m bench task-candidates --n 150 --out bench/results/reasoning_task_candidates_cpu.json
    python -m bench task-candidates --only chain3_2digit --n 50 --out /tmp/c.json

Each candidate is a ``danka.data.tasks.chain_rows`` variant (held-out split, seed 0),
answered greedily (``danka.tools.evaluate.evaluate_rows``), scored by verl's strict GSM8K
reward (the number after "####"; the primary) with flexible GSM8K and last_number as
metrics, and its floor computed by ``danka.diagnose.floors.guess_floors`` with the same
reward computer.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
STEP = 'Think step by step, then give the final answer after "####".'
GSM8K = 'Let\'s think step by step and output the final answer after "####".'
# one worked example before the question: the model sees the step format and "####"
ONE_SHOT = (
    "Answer the question like the example: one step per line, then the final answer "
    'after "####".\nExample: What is 5 + 7 - 3?\n5 + 7 = 12\n12 - 3 = 9\n#### 9\n'
    "Question: What is {expr}?"
)
ONE_AT_A_TIME = 'Work it out one operation at a time, then write the final answer after "####".'
LINES = 'Work it out one step per line, then write the final answer after "####".'
DEMO3 = (("What is 23 + 41 - 17? " + LINES, "23 + 41 = 64\n64 - 17 = 47\n#### 47"),)
DEMO_MIXED = (
    ("What is 36 + 7 - 4 + 9? " + LINES, "36 + 7 = 43\n43 - 4 = 39\n39 + 9 = 48\n#### 48"),
)
DEMO_MIXED3 = (("What is 36 + 7 - 4? " + LINES, "36 + 7 = 43\n43 - 4 = 39\n#### 39"),)
DEMO2 = (("What is 36 + 47? " + LINES, "36 + 47 = 83\n#### 83"),)
DIRECT = 'Write only the final answer, after "####".'
DEMO2_DIRECT = (("What is 36 + 47? " + DIRECT, "#### 83"),)


def _c(length: int, low: int, high: int, template: str, **kw) -> dict:
    """chain_rows keyword arguments; no worked example unless ``demo`` is given."""
    return {"length": length, "low": low, "high": high, "template": template, "demo": (), **kw}


Q = "What is {expr}? "
ONLY = "What is {expr}? Reply with only the number."
# name -> chain_rows keyword arguments ("chain": data.task chain exactly as registered)
CANDIDATES: dict[str, dict] = {
    "chain": {},
    # an instruction to think step by step and answer after "####"
    "chain3_2digit": _c(3, 10, 99, Q + STEP),
    "chain3_1digit": _c(3, 1, 9, Q + STEP),
    "chain4_1digit": _c(4, 1, 9, Q + STEP),
    "chain5_1digit": _c(5, 1, 9, Q + STEP),
    "sum2_2digit": _c(2, 10, 99, Q + STEP, subtract=False),
    "sum3_2digit": _c(3, 10, 99, Q + STEP, subtract=False),
    "chain3_2digit_gsm8k_wording": _c(3, 10, 99, Q + GSM8K),
    "stepwise_chain4_1digit": _c(4, 1, 9, Q + ONE_AT_A_TIME),
    "mixed_chain3": _c(3, 1, 9, Q + STEP, first=(10, 99)),
    "mixed_chain4": _c(4, 1, 9, Q + STEP, first=(10, 99)),
    # a bare answer
    "direct_mixed_chain3": _c(3, 1, 9, ONLY, first=(10, 99)),
    "direct_mixed_chain4": _c(4, 1, 9, ONLY, first=(10, 99)),
    "direct_chain3_2digit": _c(3, 10, 99, ONLY),
    # a worked example inside the question
    "oneshot_chain3_2digit": _c(3, 10, 99, ONE_SHOT),
    "oneshot_chain3_1digit": _c(3, 1, 9, ONE_SHOT),
    "oneshot_chain4_1digit": _c(4, 1, 9, ONE_SHOT),
    "oneshot_sum2_2digit": _c(2, 10, 99, ONE_SHOT, subtract=False),
    # a worked example as an earlier chat turn
    "demo_sum2_2digit": _c(2, 10, 99, Q + LINES, subtract=False, demo=DEMO2),
    "demo_chain2_2digit": _c(2, 10, 99, Q + LINES, demo=DEMO2),
    "demo_direct_sum2_2digit": _c(2, 10, 99, Q + DIRECT, subtract=False, demo=DEMO2_DIRECT),
    "demo_chain3_2digit": _c(3, 10, 99, Q + LINES, demo=DEMO3),
    "demo_mixed_chain3": _c(3, 1, 9, Q + LINES, first=(10, 99), demo=DEMO_MIXED),
    "demo3_mixed_chain3": _c(3, 1, 9, Q + LINES, first=(10, 99), demo=DEMO_MIXED3),
    "demo_mixed_chain4": _c(4, 1, 9, Q + LINES, first=(10, 99), demo=DEMO_MIXED),
    "demo_mixed_sum3": _c(3, 1, 9, Q + LINES, first=(10, 99), subtract=False, demo=DEMO_MIXED),
}


def _rewards():
    from danka.rewards.combine import RewardSpec, build_reward_computer

    specs = [
        RewardSpec("gsm8k", 1.0, {"method": "strict"}),
        RewardSpec("gsm8k", 0.0, {"method": "flexible"}),
        RewardSpec("last_number", 0.0),
    ]
    return build_reward_computer(specs, base_dir=Path.cwd())


def measure(name: str, model, tok, rewards, n: int, max_new_tokens: int, batch: int) -> dict:
    """One candidate's base accuracy, lengths, truncation and guess floor."""
    from danka.data.tasks import chain_rows
    from danka.diagnose.floors import guess_floors, prompt_text
    from danka.tools.evaluate import evaluate_rows

    rows = chain_rows(n, seed=0, split="test", **CANDIDATES[name])
    t0 = time.time()
    res = evaluate_rows(model, tok, rows, rewards, max_new_tokens=max_new_tokens,
                        batch_size=batch)  # fmt: skip
    floors = guess_floors(rows, [prompt_text(r) for r in rows], rewards)
    return {
        "task": name,
        "kwargs": CANDIDATES[name],
        "n": res["n"],
        "accuracy_strict": res["accuracy"],
        "accuracy_per_function": res["correct_per_function"],
        "guess_floor": floors.guess_floor,
        "floors": floors.metrics(),
        "floor_guess": floors.to_json(),
        "mean_length": res["response_length"],
        "truncated": res["truncation_rate"],
        "max_new_tokens": max_new_tokens,
        "seconds": round(time.time() - t0, 1),
        "samples": res["completions"][:4],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=150, help="held-out problems per candidate")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=25, help="prompts per generate call")
    p.add_argument("--only", action="append", help="candidate name (repeatable)")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--out", required=True, help="result JSON (appended per candidate)")
    args = p.parse_args(argv)
    import torch

    from danka.tools.generate import load_for_inference

    torch.manual_seed(0)
    model, tok = load_for_inference(args.model, None, dtype="auto", device="auto")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = json.loads(out.read_text()) if out.exists() else {"candidates": {}}
    done.update(model=args.model, device=platform.node(), torch=torch.__version__)
    with _rewards() as rewards:
        for name in args.only or list(CANDIDATES):
            r = measure(name, model, tok, rewards, args.n, args.max_new_tokens, args.batch_size)
            done["candidates"][name] = r
            out.write_text(json.dumps(done, indent=2))
            print(
                f"{name}: strict {100 * r['accuracy_strict']:.1f}% (floor "
                f"{100 * r['guess_floor']:.1f}%), length {r['mean_length']:.0f}, truncated "
                f"{100 * r['truncated']:.0f}%, n {r['n']}, {r['seconds']:.0f} s",
                flush=True,
            )
    return 0
