"""How often an UNTRAINED model calls the calculator, per prompt design: the settings
``agent.tool_prompt`` x ``agent.tool_demo`` on held-out problems of the calculator task,
sampled as in examples/calculator_tool.yaml (T = 1, its instruction, 3 turns of <= 96
tokens). Reinforcement learning can only strengthen calls the model already makes, so
this rate is what a run starts from.

    python -m bench calc-prompt --n 32 --out bench/results/calc_tool_prompt_cpu.json \\
        [--design hermes:none --design hermes:auto ...]

Per design: answers with at least one valid call (``agent/valid_call_samples``), the
valid-call rate over attempted calls, calls per answer and accuracy (tool_answer reward).
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch

from bench.lib.common import parser

SHORT_TEXT = (
    "You can call these tools:\n<tools>\n{schemas}\n</tools>\nTo call one, reply with only "
    '<tool_call>\n{{"name": <tool-name>, "arguments": <args-json-object>}}\n</tool_call>\n'
    "The result comes back in <tool_response></tool_response>; then give the final answer."
)
DESIGNS = ["hermes:none", "smollm:none", "hermes:auto", "smollm:auto", "short:auto"]


def measure(model, tok, rows, tool_prompt: str, tool_demo: str, args) -> dict:
    from danka.agent.rewards import tool_answer_reward
    from danka.agent.setup import agent_generate, build_agent_loop
    from danka.rollout.base import AnswerOptions
    from danka.schema.sections import AgentConfig

    cfg = AgentConfig(
        tools=["calculator"],
        max_turns=3,
        max_tool_calls=4,
        max_total_tokens=384,
        tool_prompt=SHORT_TEXT if tool_prompt == "short" else tool_prompt,
        tool_demo=tool_demo,
    )
    loop = build_agent_loop(cfg, tok, base_dir=".", max_new_tokens=96, instruction=args.instruction)
    t0 = time.time()
    try:
        items, metrics = agent_generate(
            model,
            tok,
            rows,
            loop,
            AnswerOptions(
                instruction=args.instruction,
                max_new_tokens=96,
                temperature=args.temperature,
                top_p=1.0,
                seed=args.seed,
                batch_size=len(rows),
            ),
        )
    finally:
        loop.close()
    scores = tool_answer_reward(
        None,
        [it["trajectories"][0] for it in items],
        [it["row"].ground_truth for it in items],
        valid_call_bonus=0.0,
    )
    return {
        "tool_prompt": tool_prompt,
        "tool_demo": tool_demo,
        "prompt_tokens": len(tok(items[0]["prompt"], add_special_tokens=False)["input_ids"]),
        "answers_with_valid_call": round(metrics["agent/valid_call_samples"], 4),
        "valid_call_rate": round(metrics["agent/valid_call_rate"], 4),
        "tool_calls_per_answer": round(metrics["agent/tool_calls"], 4),
        "accuracy": sum(s == 1.0 for s in scores) / len(rows),
        "seconds": round(time.time() - t0, 1),
        "example": items[0]["trajectories"][0],
    }


def main(argv: list[str] | None = None) -> int:
    from danka.data.calc_task import calc_rows
    from danka.models.loading import load_causal_lm, load_tokenizer

    ap = parser("calc-prompt", __doc__)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--n", type=int, default=32, help="held-out problems")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--instruction", default="Use the calculator tool, then reply with only the number."
    )
    ap.add_argument("--design", action="append", help="tool_prompt:tool_demo (repeatable)")
    ap.add_argument("--out", help="result JSON")
    args = ap.parse_args(argv)
    quiet = lambda *_: None  # noqa: E731
    tok = load_tokenizer(args.model, log=quiet)
    model = load_causal_lm(args.model, dtype="float32", device=torch.device("cpu"), log=quiet)
    rows = calc_rows(args.n, seed=0, split="test")
    result = {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        "device": f"CPU ({platform.processor() or platform.machine()}), "
        f"{torch.get_num_threads()} threads, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "n": args.n,
        "temperature": args.temperature,
        "instruction": args.instruction,
        "short_text": SHORT_TEXT,
        "designs": [],
    }
    for design in args.design or DESIGNS:
        prompt, demo = design.split(":")
        row = measure(model, tok, rows, prompt, demo, args)
        result["designs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "example"}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0
