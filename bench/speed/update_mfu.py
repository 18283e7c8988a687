"""The actor update and the log-prob head at the Qwen2.5-0.5B shape.

Sections of ``python -m bench train``:

- ``update_05b``: danka's update (chunked log-probs, policy loss, backward, fused AdamW) on
  16 x 512 tokens: tokens/s, MFU = 6 * N * tokens / time / 790e12 (``mfu``; N = every
  parameter, a tied embedding/lm_head once) and by danka/models/flops.py's model FLOPs
  (``mfu_model``: LoRA's frozen base needs no weight gradients), peak memory. Weights:
  ``--gsm8k-model``'s (real, bf16), else random of ``--update-shape`` (Qwen2.5-0.5B, tied,
  by default; ``qwen2.5-coder-0.5b``: its untied head). Variants
  ``mb<micro>[+gc][+compile][+eager_head][+lora][+varlen][+graphs][+fusednorm]``
  (``--update-variants``; ``+lora``: LoRA r32 all-linear as examples/gsm8k_grpo.yaml, else
  full-parameter; ``+graphs``: speed.cuda_graphs, with +varlen; ``+fusednorm``: RMSNorm
  through F.rms_norm, danka.models.fused_norm); ``--profile`` adds
  the top CUDA kernels of a few more steps (``bench/lib/kernel_profile.py``).
- ``logprob_memory``: the LM head alone, 8,192 tokens x 151,936 vocab (or, with
  ``--head-responses 512,1024``, ``--head-micro`` sequences of each response length),
  forward + backward to h and W: chunked with the fused per-chunk work (``chunked``),
  chunked eager (``chunked_eager``), and a naive full-logits log-softmax (``naive``): time,
  host enqueue time, extra memory, agreement.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from bench.lib import danka_side as ds
from bench.lib.common import (
    GIB,
    error_text,
    fmt,
    free,
    peak_gib,
    reset_peak,
    sync,
    timed,
    variant_rows,
)
from bench.lib.kernel_profile import profile_or_error
from bench.lib.training import gc_active, pick_size, random_model, shape
from danka.config import load_config
from danka.models import body_graphs, tiny
from danka.models.flops import FORMULA, Counts, mfu, mfu_6nt, phase_flops
from danka.models.logprobs import chunked_logprobs_entropy
from danka.types import RolloutBatch

# (real, --tiny); b = sequences, p = prompt tokens, r = response tokens
UPDATE_SIZES = ({"b": 16, "p": 128, "r": 384, "iters": 5}, {"b": 4, "p": 16, "r": 48, "iters": 2})
HEAD_SIZES = ({"n": 16 * 512, "h": 896, "vocab": 151936, "chunk": 1024, "iters": 3},
              {"n": 4 * 64, "h": 64, "vocab": 4096, "chunk": 64, "iters": 2})  # fmt: skip


def coder_0_5b_config():
    """Qwen2.5-Coder-0.5B-Instruct's shape: Qwen2.5-0.5B's with an untied output head."""
    config = tiny.qwen2_0_5b_config()
    config.tie_word_embeddings = False
    return config


# --update-shape: random weights of this shape when --gsm8k-model is not given
SHAPES = {"qwen2.5-0.5b": tiny.qwen2_0_5b_config, "qwen2.5-coder-0.5b": coder_0_5b_config}


def update_batch(b: int, p: int, r: int, vocab: int, group: int):
    """Random full-length sequences (no padding), N(0, 1) advantages, on-policy (the
    update's own detached log-probs are pi_old)."""
    g = torch.Generator().manual_seed(0)
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, vocab, (b, p), generator=g),
        prompt_mask=torch.ones(b, p, dtype=torch.long),
        response_ids=torch.randint(0, vocab, (b, r), generator=g),
        response_mask=torch.ones(b, r),
        group_index=torch.arange(b) // group,
        truncated=torch.zeros(b, dtype=torch.bool),
    )
    return ds.train_batch(batch, torch.randn(b, r, generator=g))


def gsm8k_like_batch(b: int, vocab: int, group: int, max_new: int = 512):
    """``b`` sequences with the real GSM8K step's lengths (left-padded prompts of 110-200
    tokens, right-padded answers ~N(220, 110) clipped to 30..max_new: the examples' ~350
    real tokens a sequence, every 20th answer truncated at max_new), N(0, 1) advantages."""
    g = torch.Generator().manual_seed(0)
    p_len = torch.randint(110, 201, (b,), generator=g)
    r_len = (torch.randn(b, generator=g) * 110 + 220).clamp(30, max_new).long()
    r_len[::20] = max_new
    p, r = int(p_len.max()), int(r_len.max())
    cols_p, cols_r = torch.arange(p)[None], torch.arange(r)[None]
    prompt_mask = (cols_p >= p - p_len[:, None]).long()
    response_mask = (cols_r < r_len[:, None]).float()
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, vocab, (b, p), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=(torch.randint(0, vocab, (b, r), generator=g) * response_mask).long(),
        response_mask=response_mask,
        group_index=torch.arange(b) // group,
        truncated=r_len == max_new,
    )
    real = int(p_len.sum() + r_len.sum())
    return ds.train_batch(batch, torch.randn(b, r, generator=g)), real, int(r_len.sum()), p, r


def update_config(args, dev, b: int, p: int, r: int, lora: bool):
    """The update's settings: GRPO, one mini-batch of ``b`` sequences; LoRA as
    examples/gsm8k_grpo.yaml (r32, alpha 64, all-linear) or full-parameter."""
    group = 8 if b % 8 == 0 else b
    cfg, _ = load_config(None, [
        "model.actor_model_name_or_path=random:qwen2-0.5b", f"model.device={dev}",
        "data.task=arithmetic", "trainer.algorithm=grpo", f"trainer.batch_size={b // group}",
        f"trainer.samples_per_prompt={group}", f"trainer.micro_batch_size={b}",
        f"trainer.max_new_tokens={r}", f"trainer.max_length={p + r}", "trainer.lr=1e-6",
        "trainer.kl.coef=0", f"lora.enable_lora={str(lora).lower()}", "lora.lora_r=32",
        "lora.lora_alpha=64", "lora.target_modules=all-linear",
    ])  # fmt: skip
    return cfg, group


def base_model(args, dev):
    """(model, config, dtype, what): ``--gsm8k-model``'s weights (bf16), else random weights
    of ``--update-shape`` (``--tiny``: a tiny Qwen2)."""
    if args.gsm8k_model and not args.tiny:
        from danka.models.loading import load_causal_lm

        quiet = lambda *_: None  # noqa: E731
        model = load_causal_lm(args.gsm8k_model, dtype="bfloat16", device=str(dev), log=quiet)
        return model.eval(), model.config, torch.bfloat16, args.gsm8k_model
    config, dtype = shape(args, SHAPES[args.update_shape])
    return (
        random_model(config, dev, dtype),
        config,
        dtype,
        "tiny" if args.tiny else args.update_shape,
    )


def update_05b(args, dev: torch.device, log) -> dict:
    z = pick_size(args, UPDATE_SIZES)
    b, p, r = z.b, z.p, z.r
    tokens = b * (p + r)
    out = {"seqs": b, "prompt_len": p, "response_len": r, "tokens_per_step": tokens,
           "mfu_formula": "mfu: 6 * params * tokens / step_s / 790e12 (all params, a tied "
           "matrix once); mfu_model: " + FORMULA, "variants": {}}  # fmt: skip
    variants = [v.strip() for v in args.update_variants.split(",") if v.strip()]
    for lora in (False, True):  # one model set per kind: peft wraps the base in place
        group = [v for v in variants if ("+lora" in v) == lora]
        if group:
            _update_group(args, dev, log, z, lora, group, out)
            free(dev)
    return out


def _update_group(args, dev, log, z, lora: bool, variants: list[str], out: dict) -> None:
    b, p, r = z.b, z.p, z.r
    tokens, responses = b * (p + r), b * r
    real = None
    if args.update_seqs and not args.tiny:  # the real step's shape: GSM8K-like lengths
        b = args.update_seqs
        real = gsm8k_like_batch(b, 151936, 8)
        _, tokens, responses, p, r = real
        out.update(
            seqs=b,
            prompt_len=p,
            response_len=r,
            tokens_per_step=tokens,
            response_tokens=responses,
            lengths="gsm8k-like",
        )
    try:
        cfg, group = update_config(args, dev, b, p, r, lora)
        base, config, dtype, what = base_model(args, dev)
        models = ds.wrap_models(cfg, base, log)  # checkpointing toggled below
        run = ds.build_run_for_bench(cfg, models, dev, dtype, log)
    except Exception as err:  # noqa: BLE001
        out["variants"].update({v: {"error": error_text(err)} for v in variants})
        return
    if args.train_mode:
        base.train()
    counts = Counts.of(ds.policy_of(run))
    out.update(shape=what, params=counts.total)
    out.setdefault("counts", {})["lora" if lora else "full"] = vars(counts)
    flops = phase_flops(
        counts,
        prompt=tokens - responses,
        response=responses,
        sequences=b,
        logprob_passes=0,
        critic=False,
        full=not lora,
    )["update"]
    batch = real[0] if real else update_batch(b, p, r, config.vocab_size, group)
    stages = ds.stages_of(run)
    padded = stages.updating
    compiled = False
    for variant in variants:
        micro = int(variant.split("+")[0].removeprefix("mb"))
        try:
            if "+gc" in variant:
                base.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                base.gradient_checkpointing_disable()
            ds.set_micro_batch(run, micro)
            ds.set_packed_update(run, "+varlen" in variant, p + r, padded)
            ds.set_cuda_graphs(run, "+graphs" in variant)  # speed.cuda_graphs (varlen only)
            ds.fuse_norms("+fusednorm" in variant, base)
            fused = "+eager_head" not in variant  # A/B: speed.fused_logprob_head
            if "+compile" in variant and not compiled:  # speed.compile (stays on: list last)
                ds.compile_body(base, dev)
                compiled = True
            if lora and not compiled:  # A/B: +peftlora is peft's forward (adapters in bf16)
                ds.fuse_lora(ds.policy_of(run), "+peftlora" not in variant)

            chunk = next((int(x[5:]) for x in variant.split("+") if x.startswith("chunk")), None)

            def step(run=run, batch=batch, fused=fused, chunk=chunk):
                ds.update_step(run, batch, fused_head=fused, chunk=chunk)

            warmup_s = timed(step, dev)  # warm-up (allocator, cuBLAS, AdamW state, compile)
            reset_peak(dev)
            times = [timed(step, dev) for _ in range(z.iters)]
            s = statistics.median(times)
            out["variants"][variant] = {
                "micro_batch": micro, "gc_active": gc_active(base), "compiled": compiled,
                "fused_head": fused, "lora": lora, "varlen": "+varlen" in variant,
                "chunk": chunk, "cuda_graphs": "+graphs" in variant,
                "fused_norm": "+fusednorm" in variant,
                "warmup_step_s": warmup_s, "step_s": s,
                "tok_s": tokens / s, "mfu": mfu_6nt(counts, tokens, s),
                "model_tflop": flops / 1e12, "mfu_model": mfu(flops, s),
                "peak_gib": peak_gib(dev), "compile_failed": ds.compile_failures(),
                "graph_failures": list(body_graphs.failures),
            }  # fmt: skip
            if args.profile:  # top kernels of a few more steps (after the timing)
                out["variants"][variant]["profile"] = profile_or_error(
                    step, dev, steps=args.profile_steps, step_s=s
                )
        except Exception as err:  # noqa: BLE001
            out["variants"][variant] = {"error": error_text(err)}
        free(dev)


def _naive_logprobs(h, w, y, temperature=1.0):
    """Full (N, V) float32 logits, log_softmax, gather: what a plain HF forward does."""
    logp = torch.log_softmax(F.linear(h, w).float() / temperature, dim=-1)
    return logp.gather(-1, y[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _head_step(fn, h0, w0, y, g_lp, g_ent, dev, iters):
    """Warm-up, then time ``iters`` forward + backward passes of ``fn(h, w) -> (logp, ent)``.
    Returns (result dict, (logp, grad_h, grad_w) of the warm-up in fp32)."""
    h, w = h0.clone().requires_grad_(True), w0.clone().requires_grad_(True)

    def step():
        h.grad = w.grad = None
        lp, ent = fn(h, w)
        ((lp * g_lp).sum() + (ent * g_ent).sum()).backward()
        return lp

    lp = step()
    first = (lp.detach().float(), h.grad.float(), w.grad.float())
    del lp
    h.grad = w.grad = None
    free(dev)
    base = torch.cuda.memory_allocated(dev) / GIB if dev.type == "cuda" else None
    reset_peak(dev)
    times = [timed(step, dev) for _ in range(iters)]
    peak = peak_gib(dev)
    enqueue = []  # host seconds to queue one step (no sync inside): launch/host cost
    for _ in range(iters):
        sync(dev)
        t0 = time.perf_counter()
        step()
        enqueue.append(time.perf_counter() - t0)
    sync(dev)
    return {"step_s": statistics.median(times), "enqueue_s": statistics.median(enqueue),
            "peak_gib": peak, "extra_gib": None if peak is None else peak - base}, first  # fmt: skip


def logprob_memory(args, dev: torch.device, log) -> dict:
    """The head at ``HEAD_SIZES``; with ``--head-responses 512,1024``: for micro-batches of
    ``--head-micro`` sequences with that many response tokens each, at chunk
    ``--head-chunk`` (the plan's pick for a 152k vocabulary: 128), under ``by_response``."""
    z = pick_size(args, HEAD_SIZES)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    responses = [int(x) for x in (args.head_responses or "").split(",") if x.strip()]
    if not responses:
        return head_methods(z.n, z.h, z.vocab, z.chunk, z.iters, dev, dtype)
    out: dict = {"micro_batch": args.head_micro, "chunk": args.head_chunk, "by_response": {}}
    for r in responses:
        n = args.head_micro * r // (8 if args.tiny else 1)  # --tiny: an eighth of the rows
        chunk = min(args.head_chunk, n) if not args.tiny else z.chunk
        out["by_response"][str(r)] = head_methods(n, z.h, z.vocab, chunk, z.iters, dev, dtype)
    return out


def head_methods(n: int, h: int, vocab: int, chunk: int, iters: int, dev, dtype) -> dict:
    """Chunked (fused, eager) and naive heads on ``n`` rows: time, extra memory, agreement."""
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(n, h, generator=g).to(dev, dtype)
    w0 = (torch.randn(vocab, h, generator=g) * 0.02).to(dev, dtype)
    y = torch.randint(0, vocab, (n,), generator=g).to(dev)
    g_lp, g_ent = torch.randn(n, generator=g).to(dev), torch.randn(n, generator=g).to(dev) / 100
    out = {
        "tokens": n,
        "hidden": h,
        "vocab": vocab,
        "dtype": str(dtype),
        "chunk": chunk,
        "what": "LM head only: log-prob + entropy, forward + backward (grads to h and W)",
    }

    def chunked(fused: bool):
        def fn(h, w):  # per-chunk work compiled (CUDA default) or eager
            return chunked_logprobs_entropy(h, w, y, chunk_size=chunk, fused=fused)

        return fn

    methods = {"chunked_eager": chunked(False), "chunked": chunked(True),
               "naive": lambda h, w: _naive_logprobs(h, w, y)}  # fmt: skip
    first = {}
    for name, fn in methods.items():
        try:
            out[name], first[name] = _head_step(fn, h0, w0, y, g_lp, g_ent, dev, iters)
        except Exception as err:  # noqa: BLE001 - e.g. the naive path running out of memory
            out[name] = {"error": error_text(err)}
        free(dev)
    for name in ("chunked_eager", "chunked"):
        if name in first and "naive" in first:
            pairs = zip(("logp", "grad_h", "grad_w"), first[name], first["naive"])
            out[f"{name}_max_abs_diff"] = {k: float((a - b).abs().max()) for k, a, b in pairs}
    return out


def update_rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of ``update_05b`` for the final table."""

    def rows_of(key: str, v: dict) -> list:
        gc_tag = "" if "+gc" not in key or v["gc_active"] else " (gc INACTIVE)"
        model = v.get("mfu_model")
        speed = f"{v['tok_s'] / 1e3:.1f}k | {v['mfu']:.1%} | {fmt(model, '{:.1%}')}"
        return [
            (f"{key}{gc_tag} tok/s | MFU 6NT | MFU model", speed, ""),
            (f"{key} peak GiB", fmt(v["peak_gib"]), ""),
        ]

    return variant_rows(res["variants"], rows_of)


def logprob_rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of ``logprob_memory`` for the final table."""
    if "by_response" in res:
        rows = []
        for r, sub in res["by_response"].items():
            tag = f"{res['micro_batch']} x {r} response tokens"
            rows += [(f"{tag}: {m}", v, ref) for m, v, ref in _head_rows(sub)]
        return rows
    return _head_rows(res)


def _head_rows(res: dict) -> list[tuple[str, str, str]]:
    rows = []
    for k in ("chunked_eager", "chunked", "naive"):
        v = res.get(k, {})
        rows.append((f"{k} extra GiB | step s", "ERROR" if "error" in v else
                     f"{fmt(v.get('extra_gib'))} | {fmt(v.get('step_s'), '{:.4f}')}",
                     v.get("error", "")[:60] or f"peak {fmt(v.get('peak_gib'))} GiB"))  # fmt: skip
    for k in ("chunked_eager", "chunked"):
        if f"{k}_max_abs_diff" in res:
            d = res[f"{k}_max_abs_diff"]
            diffs = " / ".join(f"{d[x]:.1e}" for x in ("logp", "grad_h", "grad_w"))
            rows.append((f"{k} vs naive max |diff| logp / grad_h / grad_w", diffs, ""))
    return rows
