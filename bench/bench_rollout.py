"""Rollout throughput: HF ``generate`` (dynamic cache) vs danka's fast engine.

Run on the GPU machine, e.g.::

    python bench/bench_rollout.py --model HuggingFaceTB/SmolLM2-135M-Instruct --out smol.json
    python bench/bench_rollout.py --shape qwen2-0.5b --out qwen.json

Measures, at ``--prompts`` x ``--new-tokens`` (EOS disabled, so every sequence generates
all tokens and both engines do the same work): tokens/s of each engine after a warm-up,
the fast engine's first-call time (weights + CUDA-graph capture), the greedy token
agreement with HF, and the mean |log-prob diff| between the engine's reported log-probs and
a training-style forward on sampled tokens. Prints one table and writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from danka.rollout.base import SamplingParams
from danka.rollout.fast import FastEngine

SHAPES = {
    # Random weights with these configs (no download needed).
    "qwen2-0.5b": dict(
        kind="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
        tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    ),
    "smollm2-135m": dict(
        kind="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
        tie_word_embeddings=True, rope_theta=100_000.0, rms_norm_eps=1e-5,
    ),
}  # fmt: skip


def build_model(args) -> torch.nn.Module:
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
        args.dtype
    ]
    if args.model:
        from danka.models.loading import load_causal_lm  # lazy: another module of the package

        return load_causal_lm(args.model, dtype=args.dtype, device=args.device).eval()
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(SHAPES[args.shape])
    kind = shape.pop("kind")
    cfg_cls, model_cls = (
        (Qwen2Config, Qwen2ForCausalLM) if kind == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    )
    cfg = cfg_cls(**shape, max_position_embeddings=32768, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(args.device):
        model = model_cls(cfg)
    return model.to(dtype).eval()


def make_prompts(args, vocab: int) -> list[list[int]]:
    """Random token ids, lengths uniform in [0.8 L, L] (so left padding is exercised)."""
    g = torch.Generator().manual_seed(args.seed)
    lo = max(1, int(0.8 * args.prompt_len))
    lens = torch.randint(lo, args.prompt_len + 1, (args.prompts,), generator=g).tolist()
    return [torch.randint(100, vocab - 100, (n,), generator=g).tolist() for n in lens]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def hf_generate(model, prompts, new_tokens: int, greedy: bool) -> torch.Tensor:
    """HF generate with its default dynamic cache; EOS suppressed via min_new_tokens."""
    device = next(model.parameters()).device
    plen = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), plen), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, plen - len(p) :] = torch.tensor(p)
        mask[i, plen - len(p) :] = 1
    kw = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_p=1.0)
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
        top_k=None,
        **kw,
    )
    return out[:, plen:].cpu()


def timed(fn, device: str) -> tuple[float, object]:
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - t0, result


@torch.no_grad()
def training_logprobs(model, batch, chunk: int = 8) -> torch.Tensor:
    """log_softmax of a plain forward over prompt + response at the response tokens (B, R)."""
    device = next(model.parameters()).device
    out = []
    plen = batch.prompt_ids.shape[1]
    for s in range(0, batch.size, chunk):
        ids = torch.cat([batch.prompt_ids[s : s + chunk], batch.response_ids[s : s + chunk]], 1)
        mask = torch.cat(
            [batch.prompt_mask[s : s + chunk], batch.response_mask[s : s + chunk].long()], 1
        )
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        logits = model(
            input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device)
        ).logits[:, plen - 1 : -1]
        lp = torch.log_softmax(logits.float(), -1)
        resp = batch.response_ids[s : s + chunk].to(device)
        out.append(lp.gather(-1, resp[..., None])[..., 0].cpu())
    return torch.cat(out)


def prefix_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean fraction of each row that matches before the first differing token."""
    same = (a == b).long().cumprod(1)
    return float(same.sum(1).float().mean() / a.shape[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="hub id, local folder or .gguf (danka.models.loading)")
    src.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this shape")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=160)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--agree-tokens", type=int, default=64, help="greedy agreement length")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--skip-hf", action="store_true", help="engine only (no HF timing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_rollout.json")
    args = ap.parse_args()

    model = build_model(args)
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = make_prompts(args, vocab)
    tokens = args.prompts * args.new_tokens
    res: dict = {"model": args.model or args.shape, "prompts": args.prompts,
                 "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                 "dtype": args.dtype, "device": args.device}  # fmt: skip
    if args.device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name()

    engine = FastEngine(use_cuda_graph=not args.no_cuda_graph, max_batch=max(256, args.prompts))
    sample = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new_tokens)

    def run_engine(params):
        return engine.generate(model, prompts, params, eos_ids=[], pad_id=0)

    res["fast_first_call_s"], _ = timed(lambda: run_engine(sample), args.device)
    res["fast_capture_s"] = engine.stats.get("capture_s", 0.0)
    res["fast_s"], batch = timed(lambda: run_engine(sample), args.device)
    res["fast_tok_s"] = tokens / res["fast_s"]

    if not args.skip_hf:
        timed(lambda: hf_generate(model, prompts[:4], 8, greedy=False), args.device)  # warm-up
        res["hf_s"], _ = timed(
            lambda: hf_generate(model, prompts, args.new_tokens, greedy=False), args.device
        )
        res["hf_tok_s"] = tokens / res["hf_s"]
        res["speedup"] = res["fast_tok_s"] / res["hf_tok_s"]
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.agree_tokens)
        ours = run_engine(greedy).response_ids
        ref = hf_generate(model, prompts, args.agree_tokens, greedy=True)
        res["greedy_token_agreement"] = float((ours == ref).float().mean())
        res["greedy_prefix_agreement"] = prefix_agreement(ours, ref)

    train_lp = training_logprobs(model, batch)
    diff = (batch.rollout_logprobs - train_lp).abs() * batch.response_mask
    res["logprob_mean_abs_diff"] = float(diff.sum() / batch.response_mask.sum())
    res["logprob_max_abs_diff"] = float(diff.max())
    if args.device.startswith("cuda"):
        res["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30

    print(f"\nrollout benchmark: {res['model']}  {args.prompts} x {args.new_tokens} new tokens, "
          f"prompt ~{args.prompt_len}, {args.dtype}, {res.get('gpu', args.device)}")  # fmt: skip
    rows = [
        ("HF generate (dynamic cache)", res.get("hf_tok_s"), res.get("hf_s")),
        ("fast engine", res["fast_tok_s"], res["fast_s"]),
    ]
    print(f"{'engine':<30}{'tok/s':>12}{'seconds':>10}")
    for name, tps, sec in rows:
        if tps is not None:
            print(f"{name:<30}{tps:>12,.0f}{sec:>10.2f}")
    for key in ("speedup", "fast_first_call_s", "fast_capture_s", "greedy_token_agreement",
                "greedy_prefix_agreement", "logprob_mean_abs_diff", "logprob_max_abs_diff",
                "peak_mem_gib"):  # fmt: skip
        if key in res:
            print(f"  {key:<28}{res[key]:.4g}")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
