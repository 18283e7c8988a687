"""One side of the rollout benchmark, in its own process (``bench/run.py rollout`` runs
every side in a fresh process and merges them; timing HF after the engine ran in the same
process understated HF by 3-4x).

Sides, at ``--prompts`` x ``--new-tokens`` (EOS disabled, so every sequence generates all
tokens and every side does the same work), each with its first-call time and a timed call:
``fast`` (danka's engine; with ``--lora`` also with a live LoRA adapter, and the mean
|log-prob diff| to a training forward), ``hf-dynamic`` (HF generate, dynamic cache) and
``hf-static`` (static cache; transformers compiles the decode step with torch.compile).
``--profile`` (fast side) adds, per variant, the top CUDA kernels of one more call under
``torch.profiler`` (bench/kernel_profile.py): name, calls, ms and % of the timed call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the bench's own modules

from kernel_profile import profile_or_error

from danka.data.template import left_pad
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
    "tiny": dict(  # CPU smoke test of the bench itself; its timings mean nothing
        kind="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, vocab_size=512,
        tie_word_embeddings=True, rope_theta=10_000.0, rms_norm_eps=1e-5,
    ),
}  # fmt: skip


FAST_SIDES = ("fast", "fast-whole-cache", "fast-compile", "fast-triton", "fast-compile-triton")


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
def hf_generate(model, prompts, new_tokens: int, greedy: bool, static: bool = False):
    """HF generate (dynamic cache, or static cache + transformers' automatic torch.compile);
    EOS suppressed via min_new_tokens."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, 0)
    plen = ids.shape[1]
    kw = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_p=1.0)
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
        top_k=None,
        cache_implementation="static" if static else None,
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


def add_lora(model, rank: int = 16):
    """peft LoRA on all seven linear types, B drawn small (a live adapter changes tokens)."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 1e-3)
    return model.eval()


def side_fast(args, model, prompts, tokens: int, res: dict) -> None:
    """danka's engine: first call (weights + graph capture), then a timed call; plain model
    and, with --lora, the same model with a live LoRA adapter (unmerged): ``lora_`` with the
    low-rank path in the adapter's fp32 (exact), ``lora_base_`` in bf16 folded into the base
    GEMMs (engine option ``lora_compute="base"``)."""
    sample = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new_tokens)
    variants = [("", "adapter")] + ([("lora_", "adapter"), ("lora_base_", "base")] * args.lora)
    lora_model = None
    for prefix, mode in variants:
        if prefix and lora_model is None:
            lora_model = add_lora(model)
        m = lora_model if prefix else model
        engine = FastEngine(
            use_cuda_graph=not args.no_cuda_graph,
            max_batch=max(256, args.prompts),
            lora_compute=mode,
            live_chunk=0 if args.side == "fast-whole-cache" else 64,
            compile_step=args.side.startswith("fast-compile"),
            attention="triton" if args.side.endswith("-triton") else "sdpa",
        )

        def run(params, m=m, engine=engine):
            return engine.generate(m, prompts, params, eos_ids=[], pad_id=0)

        res[prefix + "first_call_s"], _ = timed(lambda: run(sample), args.device)
        res[prefix + "capture_s"] = engine.stats.get("capture_s", 0.0)
        res[prefix + "s"], batch = timed(lambda: run(sample), args.device)
        res[prefix + "tok_s"] = tokens / res[prefix + "s"]
        if args.profile:  # one more call under torch.profiler: where its time goes
            res[prefix + "profile"] = profile_or_error(
                lambda: run(sample), args.device, steps=1, step_s=res[prefix + "s"]
            )
        train_lp = training_logprobs(m, batch)
        diff = (batch.rollout_logprobs - train_lp).abs() * batch.response_mask
        res[prefix + "logprob_mean_abs_diff"] = float(diff.sum() / batch.response_mask.sum())
        res[prefix + "logprob_max_abs_diff"] = float(diff.max())
        if not prefix:
            greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.agree_tokens)
            res["greedy_tokens"] = run(greedy).response_ids.tolist()
        engine.release()


def side_hf(args, model, prompts, tokens: int, res: dict, static: bool) -> None:
    """HF generate in this fresh process: dynamic cache, or static cache (transformers then
    compiles the decode step with torch.compile itself); first call timed separately."""
    res["first_call_s"], _ = timed(
        lambda: hf_generate(model, prompts, args.new_tokens, greedy=False, static=static),
        args.device,
    )
    res["s"], _ = timed(
        lambda: hf_generate(model, prompts, args.new_tokens, greedy=False, static=static),
        args.device,
    )
    res["tok_s"] = tokens / res["s"]
    if not static:
        ref = hf_generate(model, prompts, args.agree_tokens, greedy=True)
        res["greedy_tokens"] = ref.tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="hub id, local folder or .gguf (danka.models.loading)")
    src.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this shape")
    ap.add_argument(
        "--side",
        required=True,
        choices=list(FAST_SIDES) + ["hf-dynamic", "hf-static"],
        help="fast-whole-cache: the fast engine attending over the whole KV capacity at "
        "every step (live_chunk=0, the engine before session 5); fast-compile: with "
        "rollout.compile (torch.compile'd decode layer; the first call compiles); "
        "-triton: with rollout.decode_attention: triton (danka's split-K kernel)",
    )
    ap.add_argument("--lora", action="store_true", help="fast side: also with a live LoRA")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=160)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--agree-tokens", type=int, default=64, help="greedy agreement length")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--profile", action="store_true", help="fast side: top CUDA kernels per call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSON for this side")
    args = ap.parse_args()

    model = build_model(args)
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = make_prompts(args, vocab)
    tokens = args.prompts * args.new_tokens
    res: dict = {"side": args.side, "model": args.model or args.shape, "tokens": tokens}
    if args.side.startswith("fast"):
        side_fast(args, model, prompts, tokens, res)
    else:
        side_hf(args, model, prompts, tokens, res, static=args.side == "hf-static")
    if args.device.startswith("cuda"):
        res["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    with open(args.out, "w") as f:
        json.dump(res, f)
    print({k: v for k, v in res.items() if k != "greedy_tokens" and not k.endswith("profile")})


if __name__ == "__main__":
    main()
