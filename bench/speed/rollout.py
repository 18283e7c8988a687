"""Rollout tokens/s: danka's fast engine vs HF ``generate``, each side in its own process.

    python -m bench rollout --shape smollm2-135m --prompts 64 --new-tokens 256 --lora
    python -m bench rollout --shape qwen2-0.5b --sides fast,fast-compile,hf-static
    python -m bench rollout --shape tiny --prompts 4 --new-tokens 8 --prompt-len 8 \
        --sides fast,hf-dynamic          # CPU check of the bench (timings mean nothing)

Sides, at ``--prompts`` x ``--new-tokens`` (EOS disabled, so every sequence generates all
tokens and every side does the same work), each with its first-call time and a timed call:
``fast`` (danka's engine; with ``--lora`` also with a live LoRA adapter, ``lora_`` with its
fp32 low-rank path (peft's exactly), ``lora_base_`` with ``lora_compute="base"`` and
``lora_merge_`` with ``lora_compute="merge"``, and the
mean |log-prob diff| to a training forward), ``fast-whole-cache`` (attention over the whole
KV capacity), ``fast-compile`` (``rollout.compile``), ``-triton`` variants
(``rollout.decode_attention: triton``; with it the decode layer runs fused kernels,
``fast-triton-unfused`` runs the same engine with the unfused ops: an A/B of
``danka.rollout.fast.triton_step``; ``fast-triton-fusedsample`` samples with
``danka.rollout.fast.triton_sample`` instead of the torch ops), ``hf-dynamic`` (HF generate,
dynamic cache) and ``hf-static`` (static cache; transformers compiles the decode step), and
``vllm``, ``vllm-lora-merge``, ``vllm-lora-adapter`` (danka's colocated vLLM engine,
``bench/speed/vllm_side.py``; recorded as skipped with the reason where vLLM cannot run). With
``--eos`` every side stops at the tokenizer's stop ids on chat-formatted GSM8K-style
questions (``--model``), and tok/s counts the tokens generated. Timing HF after the
engine ran in the same process understates HF 3-4x, so every side runs in a fresh
``python -m bench rollout --side NAME`` process; the result JSON holds both sides of every
ratio and the greedy-token agreement of fast vs HF. ``--profile`` (fast sides) adds the top
CUDA kernels of one more call (``bench/lib/kernel_profile.py``).

The real shape (the GSM8K rollout of examples/gsm8k_*.yaml):

    python -m bench rollout --model qwen2.5-coder-0.5b-instruct.gguf \
        --prompts-from data/gsm8k/train.jsonl --prompts 256 --new-tokens 512 --eos both \
        --lora --lora-modes auto --lora-rank 32 --sides fast-default,hf-static --profile

``--model`` loads real weights (a .gguf converted once to its HF folder), ``--prompts-from``
takes real questions at their own lengths through the chat template with the example's
instruction, ``--eos both`` times each call without end tokens (``tok_s``: equal work on
every side) and with the model's (``eos_tok_s``: tokens actually generated). Side
``fast-default`` is the engine ``danka train`` builds with every ``rollout.*`` option at its
default (Triton decode attention on a GPU; ``lora_auto_``: ``rollout.lora_compute: auto``).
``goals`` holds the rollout goals: >= 4x HF's static cache and >= 50k generated tokens/s.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.lib.common import (
    add_output_args,
    bench_command,
    parser,
    ratio,
    run_side,
    sides_folder,
    sides_main,
    timed_call,
    write_result,
)
from bench.lib.kernel_profile import profile_or_error
from bench.speed.rollout_real import eos_ids, generated_tokens, goals, gsm8k_prompts
from bench.speed.vllm_side import VLLM_SIDES, eos_prompts, side_vllm, vllm_skip_reason
from danka.data.template import left_pad
from danka.rollout.base import EngineOptions, SamplingParams, build_engine
from danka.rollout.fast.engine import FastEngine
from danka.rollout.fast.options import FastExperiments, FastOptions

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


FAST_SIDES = (
    "fast", "fast-whole-cache", "fast-compile", "fast-triton", "fast-compile-triton",
    "fast-triton-unfused", "fast-triton-fusedsample", "fast-default",
)  # fmt: skip


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
    """Random token ids, lengths uniform in [0.8 L, L] (so left padding is exercised); with
    ``--prompts-from`` the file's first ``--prompts`` GSM8K questions as danka renders them
    (the model's chat template, ``--instruction`` appended), at their own lengths."""
    if args.prompts_from:
        return gsm8k_prompts(args)
    g = torch.Generator().manual_seed(args.seed)
    lo = max(1, int(0.8 * args.prompt_len))
    lens = torch.randint(lo, args.prompt_len + 1, (args.prompts,), generator=g).tolist()
    return [torch.randint(100, vocab - 100, (n,), generator=g).tolist() for n in lens]


@torch.no_grad()
def hf_generate(model, prompts, new_tokens: int, greedy: bool, static: bool = False, eos=()):
    """HF generate (dynamic cache, or static cache + transformers' automatic torch.compile);
    EOS suppressed via min_new_tokens, or with ``eos`` ids the answers end at them."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, 0)
    plen = ids.shape[1]
    kw = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_p=1.0)
    if eos:
        kw["eos_token_id"] = list(eos)
    else:
        kw["min_new_tokens"] = new_tokens
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=new_tokens,
        pad_token_id=0,
        top_k=None,
        cache_implementation="static" if static else None,
        **kw,
    )
    return out[:, plen:].cpu()


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


def logprob_gap(model, batch) -> tuple[float, float]:
    """(mean, max) |rollout log-prob - training-forward log-prob| over the response tokens."""
    diff = (batch.rollout_logprobs - training_logprobs(model, batch)).abs() * batch.response_mask
    return float(diff.sum() / batch.response_mask.sum()), float(diff.max())


LORA_PREFIX = {"adapter": "lora_", "base": "lora_base_", "merge": "lora_merge_",
               "auto": "lora_auto_"}  # fmt: skip


def eos_modes(args) -> list[tuple[str, list[int]]]:
    """(key prefix, end ids) of each timed call: EOS off (every sequence runs all
    ``--new-tokens``: equal work on every side) and/or on (the model's end tokens)."""
    if args.eos == "off":
        return [("", [])]
    # a random-weight --shape stops at an arbitrary id (CPU checks of the bench only)
    ids = eos_ids(args) if args.model else [SHAPES[args.shape]["vocab_size"] // 2]
    off, on = ("", []), ("eos_", ids)
    return {"off": [off], "on": [on], "both": [off, on]}[args.eos]


def side_fast(args, model, prompts, tokens: int, res: dict) -> None:
    """danka's engine: first call (weights + graph capture), then a timed call per EOS mode;
    plain model and, with --lora, the same model with a live LoRA adapter (unmerged) per
    ``--lora-modes``: ``lora_`` with the low-rank path in the adapter's fp32 (exact),
    ``lora_base_`` in bf16 folded into the base GEMMs (engine option
    ``lora_compute="base"``), ``lora_merge_`` merged into bf16 copies of the weights at
    every call (``lora_compute="merge"``), ``lora_auto_`` the default (``auto``). Side
    ``fast-default`` builds the engine as ``danka train`` does with every rollout option
    at its default."""
    sample = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new_tokens)
    modes = [m.strip() for m in args.lora_modes.split(",") if m.strip()]
    variants = [("", "adapter")] + [(LORA_PREFIX[m], m) for m in modes] * args.lora
    lora_model = None
    for prefix, mode in variants:
        if prefix and lora_model is None:
            lora_model = add_lora(model, args.lora_rank)
        m = lora_model if prefix else model
        if args.side == "fast-default":  # what danka train builds with rollout.* unset
            engine = build_engine("fast", EngineOptions(lora_compute=mode if prefix else "auto"))
        else:
            engine = FastEngine(
                FastOptions(
                    batch_size=max(256, args.prompts),
                    lora_compute=mode,
                    compile_step=args.side.startswith("fast-compile"),
                    attention="triton" if "-triton" in args.side else "sdpa",
                ),
                FastExperiments(
                    use_cuda_graph=not args.no_cuda_graph,
                    live_chunk=0 if args.side == "fast-whole-cache" else 64,
                    fused_step=False if args.side.endswith("-unfused") else None,
                    fused_sampling=args.side.endswith("-fusedsample"),
                ),
            )

        def run(params, m=m, engine=engine, eos=()):
            return engine.generate(m, prompts, params, eos_ids=list(eos), pad_id=0)

        res[prefix + "first_call_s"], _ = timed_call(lambda: run(sample), args.device)
        res[prefix + "capture_s"] = engine.stats.get("capture_s", 0.0)
        for tag, eos in eos_modes(args):
            key = tag + prefix
            res[key + "s"], batch = timed_call(lambda eos=eos: run(sample, eos=eos), args.device)
            n = tokens if not eos else float(batch.response_mask.sum())
            res[key + "tokens"], res[key + "tok_s"] = n, n / res[key + "s"]
            for stat in ("compactions", "graphs_captured"):  # the decode batch shrinking
                res[key + stat] = engine.stats.get(stat)
        if args.profile:  # one more call under torch.profiler: where its time goes
            step_s = res.get(prefix + "s") or res.get("eos_" + prefix + "s")
            res[prefix + "profile"] = profile_or_error(
                lambda: run(sample), args.device, steps=1, step_s=step_s
            )
        rows = torch.arange(min(batch.size, args.check_rows or batch.size))
        batch = batch.select(rows)
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
    compiles the decode step with torch.compile itself); first call timed separately, then
    a timed call per EOS mode."""

    def gen(eos=()):
        return hf_generate(model, prompts, args.new_tokens, greedy=False, static=static, eos=eos)

    res["first_call_s"], _ = timed_call(gen, args.device)
    for tag, eos in eos_modes(args):
        res[tag + "s"], out = timed_call(lambda eos=eos: gen(eos), args.device)
        n = tokens if not eos else generated_tokens(out, eos)
        res[tag + "tokens"], res[tag + "tok_s"] = n, n / res[tag + "s"]
    if not static:
        ref = hf_generate(model, prompts, args.agree_tokens, greedy=True)
        res["greedy_tokens"] = ref.tolist()


HF_SIDES = ("hf-dynamic", "hf-static")
VARIANTS = FAST_SIDES[1:]  # engine variants, compared with the default fast side
# plain, LoRA live, LoRA folded (lora_compute base), LoRA merged (lora_compute merge), LoRA
# in the default mode; each with EOS off ("") and on ("eos_")
PREFIXES = tuple(e + p for e in ("", "eos_") for p in ("", *LORA_PREFIX.values()))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = parser("rollout", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="hub id, local folder or .gguf (danka.models.loading)")
    src.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this shape")
    ap.add_argument(
        "--sides",
        default="fast,hf-dynamic,hf-static",
        help=f"comma list of {', '.join(FAST_SIDES + HF_SIDES + tuple(VLLM_SIDES))}: "
        "fast-whole-cache attends "
        "over the whole KV capacity every step (live_chunk=0); fast-compile adds "
        "rollout.compile (the first call compiles); -triton uses rollout.decode_attention: "
        "triton (danka's split-K kernel)",
    )
    ap.add_argument(
        "--side", choices=FAST_SIDES + HF_SIDES + tuple(VLLM_SIDES), help="(internal) one side"
    )
    ap.add_argument("--lora", action="store_true", help="fast sides: also with a live LoRA")
    ap.add_argument("--lora-modes", default="adapter,base,merge",
                    help="--lora: the adapter's compute modes (adapter, base, merge, auto)")  # fmt: skip
    ap.add_argument("--lora-rank", type=int, default=16, help="--lora: rank (all-linear)")
    ap.add_argument("--prompts-from", help="GSM8K jsonl: real questions as danka renders them "
                    "(needs --model for the tokenizer)")  # fmt: skip
    ap.add_argument("--instruction", help="--prompts-from: text appended to each question "
                    "(default: examples/gsm8k_grpo.yaml's data.instruction)")  # fmt: skip
    ap.add_argument("--eos", default="off", choices=["off", "on", "both"],
                    help="timed calls without end tokens (equal work), with the model's, or "
                    "both; with --model and no --prompts-from the prompts are GSM8K-style "
                    "questions the model answers and ends; a --shape stops at an arbitrary "
                    "id (CPU checks of the bench only)")  # fmt: skip
    ap.add_argument("--check-rows", type=int, default=0, help="fast sides: rows of the "
                    "log-prob check against a training forward (0: all)")  # fmt: skip
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=160)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--agree-tokens", type=int, default=64, help="greedy agreement length")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--profile", action="store_true", help="fast sides: top CUDA kernels per call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="(with --side) the side's JSON")
    add_output_args(ap, timeout=300)
    args = ap.parse_args(argv)
    if args.prompts_from and not args.model:
        ap.error("--prompts-from needs --model (its tokenizer)")
    return args


def one_side(args) -> None:
    """This process runs ``args.side`` and writes its JSON to ``args.out``."""
    model = build_model(args)
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = make_prompts(args, vocab)
    if args.eos != "off" and args.model and not args.prompts_from:  # answers that end
        prompts, _ = eos_prompts(args.model, args.prompts, args.seed)
    tokens = args.prompts * args.new_tokens
    lens = [len(p) for p in prompts]
    res: dict = {"side": args.side, "model": args.model or args.shape, "tokens": tokens,
                 "eos": args.eos, "prompt_tokens": {"min": min(lens), "mean": sum(lens) / len(lens),
                                   "max": max(lens)}}  # fmt: skip
    if args.side.startswith("fast"):
        side_fast(args, model, prompts, tokens, res)
    elif args.side in VLLM_SIDES:
        side_vllm(args, model, prompts, eos_modes(args), res, logprob_gap, add_lora)
    else:
        side_hf(args, model, prompts, tokens, res, static=args.side == "hf-static")
    if args.device.startswith("cuda"):  # vLLM resets the peak when it starts: see device_used
        res["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        res["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        free_b, total_b = torch.cuda.mem_get_info()
        res["device_used_gib"] = (total_b - free_b) / 2**30  # this process alone: all of it
    Path(args.out).write_text(json.dumps(res))
    print({k: v for k, v in res.items() if k != "greedy_tokens" and not k.endswith("profile")})


def side_args(args, side: str) -> list[str]:
    """The command-line of one side's child process."""
    cmd = ["--side", side, "--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens)]
    cmd += ["--prompt-len", str(args.prompt_len), "--device", args.device, "--dtype", args.dtype]
    cmd += ["--shape", args.shape] if args.shape else ["--model", args.model]
    cmd += ["--eos", args.eos, "--seed", str(args.seed)]
    cmd += ["--prompts-from", args.prompts_from] if args.prompts_from else []
    cmd += ["--instruction", args.instruction] if args.instruction is not None else []
    fast = side.startswith("fast")
    cmd += ["--lora", "--lora-modes", args.lora_modes, "--lora-rank", str(args.lora_rank)] if (
        args.lora and fast) else []  # fmt: skip
    cmd += ["--check-rows", str(args.check_rows)] if fast else []
    cmd += ["--profile"] if args.profile and fast else []
    return cmd + (["--no-cuda-graph"] if args.no_cuda_graph else [])


def compare(args) -> dict:
    """Every side in its own process, then the ratios from both sides."""
    res: dict = {
        "bench": "rollout",
        "model": args.shape or args.model,
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "prompt_len": args.prompt_len,
        "prompts_from": args.prompts_from,
        "eos": args.eos,
        "settings": "bf16, sampling temperature 1; EOS off: every sequence generates "
        "new_tokens (keys without eos_), EOS on: the model's end tokens (keys eos_*, tokens = "
        "those generated); each side in its own fresh process; HF sides on the plain model",
        "sides": {},
    }
    with sides_folder(args.out_dir) as tmp:
        for side in args.sides.split(","):
            if side in VLLM_SIDES and (reason := vllm_skip_reason(args.device)):
                res["sides"][side] = {"skipped": reason}
                print(side, "skipped:", reason, flush=True)
                continue
            cmd = bench_command("rollout", *side_args(args, side))
            side_res = res["sides"][side] = run_side(cmd, tmp / f"{side}.json", args.timeout)
            shown = {
                k: v for k, v in side_res.items() if k != "greedy_tokens" and "profile" not in k
            }
            print(side, shown, flush=True)
            partial = {**res, "partial": True, "sides": {k: {x: y for x, y in v.items()
                       if x != "greedy_tokens"} for k, v in res["sides"].items()}}  # fmt: skip
            write_result(partial, args.out_dir, result_name(args))  # a run cut short keeps it
    s = res["sides"]
    fast = s.get("fast", {})
    vllm_ratios(res, s)  # before the greedy tokens of the other sides are dropped
    for other in VARIANTS:  # engine variants vs the default
        o = s.get(other, {})
        for prefix in PREFIXES:
            if f"{prefix}tok_s" in fast and f"{prefix}tok_s" in o:
                res[f"{other.replace('-', '_')}_{prefix}over_fast"] = ratio(
                    other, o[f"{prefix}tok_s"], "fast", fast[f"{prefix}tok_s"]
                )
        o.pop("greedy_tokens", None)
    for hf in HF_SIDES:  # every fast variant against each HF path, EOS off and on
        for side in FAST_SIDES:
            for prefix in PREFIXES:
                base = s.get(hf, {}).get(f"{'eos_' if prefix.startswith('eos_') else ''}tok_s")
                got = s.get(side, {}).get(f"{prefix}tok_s")
                if base and got:
                    key = f"{side.replace('-', '_')}_{prefix}over_{hf.replace('-', '_')}"
                    name = f"{side}_{prefix}".rstrip("_")
                    res[key] = ratio(name, got, hf.replace("-", "_"), base)
    a, b = fast.pop("greedy_tokens", None), s.get("hf-dynamic", {}).pop("greedy_tokens", None)
    if a and b:
        same = [[int(x == y) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]
        res["greedy_token_agreement"] = sum(map(sum, same)) / sum(map(len, same))
    res["goals"] = goals(res)
    return res


def vllm_ratios(res: dict, s: dict) -> None:
    """Each vllm side against every other side that ran, EOS off and on (plain tok/s; a
    LoRA side against each LoRA path of the fast sides, ``lora_auto_`` the default), and its
    greedy-token agreement with the fast and HF sides."""
    for v in VLLM_SIDES:
        # a LoRA side against every LoRA path of the fast sides that ran (lora_auto_: what
        # danka train runs); the plain side against the plain fast and HF sides
        prefixes = LORA_PREFIX.values() if VLLM_SIDES[v] else ("",)
        for tag, prefix in ((t, p) for t in ("", "eos_") for p in prefixes):
            got = s.get(v, {}).get(f"{tag}tok_s")
            if not got:
                continue
            for other in FAST_SIDES + HF_SIDES:
                fast = other in FAST_SIDES
                base = s.get(other, {}).get(f"{tag}{prefix}tok_s" if fast else f"{tag}tok_s")
                if base and (not prefix or fast):
                    name = f"{other}_{tag}{prefix}".rstrip("_").replace("-", "_")
                    key = f"{v.replace('-', '_')}_{tag}over_{name}"
                    res[key] = ratio(f"{v}_{tag}".rstrip("_").replace("-", "_"), got, name, base)
        mine = s.get(v, {}).pop("greedy_tokens", None)
        for other in ("fast", "fast-triton", "hf-dynamic"):
            theirs = s.get(other, {}).get("greedy_tokens")
            if mine and theirs and not VLLM_SIDES[v]:
                same = [[int(x == y) for x, y in zip(ra, rb)] for ra, rb in zip(mine, theirs)]
                res[f"greedy_token_agreement_{v}_{other}"] = sum(map(sum, same)) / sum(
                    map(len, same)
                )


def result_name(args) -> str:
    if args.name:
        return args.name
    return f"rollout_{Path(str(args.shape or args.model)).stem}_{args.prompts}x{args.new_tokens}"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return sides_main(args, one_side, compare, result_name(args))
