"""Held-out accuracy of an untrained model on the calculator task, without and with the
calculator tool offered (no training): the starting point of examples/calculator_tool.yaml.

    python -m bench calc-baseline [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--n 50]
"""

from __future__ import annotations

import json
import time

import torch

from bench.lib.common import parser
from danka.agent.rewards import final_number, same_number, tool_answer_reward
from danka.agent.setup import build_agent_loop
from danka.data.calc_task import calc_rows
from danka.models.loading import load_causal_lm, load_tokenizer, pick_device, stop_ids
from danka.rollout.base import SamplingParams, build_engine
from danka.schema.sections import AgentConfig

NO_TOOL = " Reply with only the number."
WITH_TOOL = " Use the calculator tool, then reply with only the number."
ONE_SHOT = (
    ' Call it like this: <tool_call>{"name": "calculator", "arguments": {"expression": '
    '"12 * 34"}}</tool_call>'
)


def no_tool_accuracy(engine, model, tok, rows) -> dict:
    t0 = time.time()
    ids = [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": r.prompt + NO_TOOL}],
                tokenize=False,
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )["input_ids"]
        for r in rows
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=32)
    batch = engine.generate(model, ids, params, eos_ids=stop_ids(tok), pad_id=tok.pad_token_id)
    texts = tok.batch_decode(batch.response_ids, skip_special_tokens=True)
    correct = [same_number(final_number(t), r.ground_truth) for t, r in zip(texts, rows)]
    return {"accuracy": sum(correct) / len(rows), "s": time.time() - t0, "examples": texts[:3]}


def main(argv: list[str] | None = None) -> int:
    ap = parser("calc-baseline", __doc__)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--sampled", action="store_true", help="also sample the tool run at T=1")
    ap.add_argument("--one-shot", action="store_true", help="show an example call in the prompt")
    ap.add_argument("--skip-no-tool", action="store_true")
    ap.add_argument("--tool-prompt", default="auto", help="agent.tool_prompt")
    ap.add_argument("--tool-demo", default="auto", help="agent.tool_demo (none: no examples)")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    quiet = lambda *_: None  # noqa: E731
    tok = load_tokenizer(args.model, log=quiet)
    model = load_causal_lm(args.model, dtype="float32", device=device, log=quiet)
    engine = build_engine(args.engine)
    rows = calc_rows(args.n, seed=0, split="test")
    truths = [r.ground_truth for r in rows]
    eos, pad = stop_ids(tok), tok.pad_token_id
    result = {"model": args.model, "n": args.n, "device": str(device)}

    if not args.skip_no_tool:  # 1. no tools, greedy
        result["no_tool_greedy"] = no_tool_accuracy(engine, model, tok, rows)
    print(json.dumps(result), flush=True)

    cfg = AgentConfig(
        tools=["calculator"],
        max_turns=3,
        max_tool_calls=4,
        max_total_tokens=320,
        tool_prompt=args.tool_prompt,
        tool_demo=args.tool_demo,
    )
    hint = WITH_TOOL + (ONE_SHOT if args.one_shot else "")
    loop = build_agent_loop(cfg, tok, base_dir=".", max_new_tokens=96, instruction=hint.strip())
    msgs = [[{"role": "user", "content": r.prompt + hint}] for r in rows]
    runs = [("tool_greedy", 0.0)] + ([("tool_sampled_t1", 1.0)] if args.sampled else [])
    for name, temperature in runs:
        t0 = time.time()  # 2. the calculator offered (greedy, then sampled at T=1)
        torch.manual_seed(0)
        params = SamplingParams(temperature=temperature, max_new_tokens=96)
        out = loop.rollout(engine, model, rows, msgs, params, eos_ids=eos, pad_id=pad)
        completions = out.completions
        scores = tool_answer_reward(None, completions, truths, valid_call_bonus=0.0)
        result[name] = {
            "accuracy": sum(s == 1.0 for s in scores) / len(rows),
            **{k: round(v, 3) for k, v in out.metrics.items()},
            "s": time.time() - t0,
        }
        result[name + "_examples"] = completions[:2]
        print(json.dumps({name: result[name]}), flush=True)
    loop.close()
    print(json.dumps(result, indent=1))
    return 0
