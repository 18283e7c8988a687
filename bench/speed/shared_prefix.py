"""Shared-prefix prefill (HF engine) and training forward, on vs off, SmolLM2 + LoRA.

    python -m bench shared-prefix [--device cpu] [--name shared_prefix_cpu]

The quickstart's shapes: 200 held-out prompts answered greedily (the evaluation), 8 prompts
x 8 samples at T=0.7 (a rollout), 16 new tokens; one training forward + backward over the
16-row micro-batch of the quickstart (LoRA r16 on all 7 linear types). Each side
(``plain``: the shared-prefix paths switched off; ``shared``: as danka runs) in its OWN
fresh process: one warm-up, then the median of 3. The JSON keeps both sides, the ratio,
and the check that both sides produced the same tokens (and log-probs within 1e-4).
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import time

from bench.lib.common import (
    ROOT,
    add_output_args,
    bench_command,
    child_env,
    environment,
    parser,
    write_result,
)

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
BIG = ("eval_tokens", "rollout_tokens", "logprobs")  # compared, not stored
LORA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _timed(fn, repeats: int = 3) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def side(name: str, device: str) -> dict:
    """One side in this process: seconds for each workload and what it produced."""
    import torch
    from peft import LoraConfig, get_peft_model

    from bench.lib import danka_side as ds
    from danka.models.loading import load_causal_lm, load_tokenizer
    from danka.rollout.base import EngineOptions, SamplingParams, build_engine

    shared = name == "shared"  # "plain": both paths off (rollout.shared_prefix,
    # speed.shared_prefix_forward): plain generate, plain training forward
    tok = load_tokenizer(MODEL, log=lambda *a: None)
    model = load_causal_lm(MODEL, dtype="float32", device=device, log=lambda *a: None)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA))
    rng = random.Random(0)

    def encode(a: int, b: int) -> list[int]:
        msg = [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}]
        text = tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=False)
        return tok(text).input_ids

    prompts = [encode(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(200)]
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    engine = build_engine("hf", EngineOptions(shared_prefix=shared))

    def gen(ps, params):
        torch.manual_seed(1)
        return engine.generate(model, ps, params, eos_ids=eos, pad_id=tok.pad_token_id or 0)

    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    sampled = SamplingParams(n=8, temperature=0.7, max_new_tokens=16)
    eval_s, eval_out = _timed(lambda: gen(prompts, greedy))
    roll_s, roll_out = _timed(lambda: gen(prompts[:8], sampled))
    mb = ds.trim(roll_out.select(torch.arange(16)))
    model.train()

    def train_step():
        model.zero_grad()
        fwd = ds.ForwardSettings(temperature=0.7, chunk_size=1024, shared_prefix=shared)
        lp, _ = ds.policy_logprobs(model, mb, settings=fwd)
        (lp * mb.response_mask.to(lp.device)).sum().backward()
        return lp.detach().cpu() * mb.response_mask

    train_s, logprobs = _timed(train_step)
    return {
        "side": name,
        "eval_200_greedy_s": eval_s,
        "rollout_8x8_s": roll_s,
        "train_fwd_bwd_16_rows_s": train_s,
        "prompt_tokens": len(prompts[0]),
        "shared_prefix_tokens": ds.common_prefix_len(prompts),
        "micro_batch": [mb.size, mb.prompt_ids.shape[1], mb.response_ids.shape[1]],
        "eval_tokens": eval_out.response_ids.tolist(),
        "rollout_tokens": roll_out.response_ids.tolist(),
        "logprobs": logprobs.tolist(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser("shared-prefix", __doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--side", choices=["plain", "shared"], help="(internal) run one side")
    add_output_args(ap, timeout=1800)
    args = ap.parse_args(argv)
    if args.side:
        print(json.dumps(side(args.side, args.device)))
        return 0
    import torch

    sides = {}
    for name in ("plain", "shared"):  # each in a fresh process
        cmd = bench_command("shared-prefix", "--side", name, "--device", args.device)
        out = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env=child_env(), check=True,
            timeout=args.timeout,
        )  # fmt: skip
        sides[name] = json.loads(out.stdout.strip().splitlines()[-1])
    a, b = sides["plain"], sides["shared"]
    lp_diff = (torch.tensor(a["logprobs"]) - torch.tensor(b["logprobs"])).abs().max().item()
    keys = ("eval_200_greedy_s", "rollout_8x8_s", "train_fwd_bwd_16_rows_s")
    result = {
        "environment": environment(),
        "device": args.device,
        "sides": {n: {k: v for k, v in s.items() if k not in BIG} for n, s in sides.items()},
        "speedup": {k: a[k] / b[k] for k in keys},
        "same_eval_tokens": a["eval_tokens"] == b["eval_tokens"],
        "same_rollout_tokens": a["rollout_tokens"] == b["rollout_tokens"],
        "max_abs_logprob_diff": lp_diff,
    }
    write_result(result, args.out_dir, args.name or f"shared_prefix_{args.device}")
    shown = ("speedup", "same_eval_tokens", "max_abs_logprob_diff")
    print(json.dumps({k: result[k] for k in shown}))
    return 0
