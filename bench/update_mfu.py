"""The full-parameter update and the log-prob head on the Qwen2.5-0.5B shape (random weights).

Sections of ``python -m bench train``:

- ``update_05b``: danka's update (chunked log-probs, policy loss, backward, fused AdamW) on
  16 x 512 tokens: tokens/s, MFU = 6 * N * tokens / time / 790e12 (N = every parameter, the
  tied embedding/lm_head once: its matmul is the lm_head), peak memory. Variants
  ``mb<micro>[+gc][+compile][+eager_head]`` (``--update-variants``); ``--profile`` adds the
  top CUDA kernels of a few more steps (``bench/kernel_profile.py``).
- ``logprob_memory``: the LM head alone, 8,192 tokens x 151,936 vocab, forward + backward to
  h and W: chunked with the fused per-chunk work (``chunked``), chunked eager
  (``chunked_eager``), and a naive full-logits log-softmax (``naive``): time, host enqueue
  time, extra memory, agreement.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from bench import danka_side as ds
from bench.common import (
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
from bench.kernel_profile import profile_or_error
from bench.training import gc_active, pick_size, random_model, shape
from danka.config import load_config
from danka.models import tiny
from danka.models.logprobs import chunked_logprobs_entropy
from danka.models.lora import count_parameters
from danka.types import RolloutBatch

PEAK_FLOPS = 790e12  # measured dense bf16 matmul ceiling of the H200 (not the 989 TF sheet)
# (real, --tiny); b = sequences, p = prompt tokens, r = response tokens
UPDATE_SIZES = ({"b": 16, "p": 128, "r": 384, "iters": 5}, {"b": 4, "p": 16, "r": 48, "iters": 2})
HEAD_SIZES = ({"n": 16 * 512, "h": 896, "vocab": 151936, "chunk": 1024, "iters": 3},
              {"n": 4 * 64, "h": 64, "vocab": 4096, "chunk": 64, "iters": 2})  # fmt: skip


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


def update_05b(args, dev: torch.device, log) -> dict:
    z = pick_size(args, UPDATE_SIZES)
    config, dtype = shape(args, tiny.qwen2_0_5b_config)
    b, p, r = z.b, z.p, z.r
    group = 8 if b % 8 == 0 else b
    cfg, _ = load_config(None, [
        "model.actor_model_name_or_path=random:qwen2-0.5b", f"model.device={dev}",
        "data.task=arithmetic", "trainer.algorithm=grpo", f"trainer.batch_size={b // group}",
        f"trainer.samples_per_prompt={group}", f"trainer.micro_batch_size={b}",
        f"trainer.max_new_tokens={r}", f"trainer.max_length={p + r}", "trainer.lr=1e-6",
        "trainer.kl.coef=0", "lora.enable_lora=false",
    ])  # fmt: skip
    base = random_model(config, dev, dtype)
    models = ds.wrap_models(cfg, base, log)  # checkpointing toggled below
    run = ds.build_run_for_bench(cfg, models, dev, dtype, log)
    if args.train_mode:
        base.train()
    n_params = count_parameters(base)[1]
    batch = update_batch(b, p, r, config.vocab_size, group)
    tokens = b * (p + r)
    out = {"shape": "tiny" if args.tiny else "qwen2.5-0.5b", "params": n_params,
           "seqs": b, "prompt_len": p, "response_len": r, "tokens_per_step": tokens,
           "mfu_formula": "6 * params * tokens / step_s / 790e12 (all params, tied emb once)",
           "variants": {}}  # fmt: skip
    compiled = False
    for variant in args.update_variants.split(","):
        micro = int(variant.split("+")[0].removeprefix("mb"))
        try:
            if "+gc" in variant:
                base.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                base.gradient_checkpointing_disable()
            ds.set_micro_batch(run, micro)
            fused = "+eager_head" not in variant  # A/B: speed.fused_logprob_head
            if "+compile" in variant and not compiled:  # speed.compile (stays on: list last)
                ds.compile_body(base, dev)
                compiled = True

            def step(run=run, batch=batch, fused=fused):
                ds.update_step(run, batch, fused_head=fused)

            warmup_s = timed(step, dev)  # warm-up (allocator, cuBLAS, AdamW state, compile)
            reset_peak(dev)
            times = [timed(step, dev) for _ in range(z.iters)]
            s = statistics.median(times)
            out["variants"][variant] = {
                "micro_batch": micro, "gc_active": gc_active(base), "compiled": compiled,
                "fused_head": fused,
                "warmup_step_s": warmup_s, "step_s": s,
                "tok_s": tokens / s, "mfu": 6 * n_params * tokens / s / PEAK_FLOPS,
                "peak_gib": peak_gib(dev),
            }  # fmt: skip
            if args.profile:  # top kernels of a few more steps (after the timing)
                out["variants"][variant]["profile"] = profile_or_error(
                    step, dev, steps=args.profile_steps, step_s=s
                )
        except Exception as err:  # noqa: BLE001
            out["variants"][variant] = {"error": error_text(err)}
        free(dev)
    return out


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
    z = pick_size(args, HEAD_SIZES)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(z.n, z.h, generator=g).to(dev, dtype)
    w0 = (torch.randn(z.vocab, z.h, generator=g) * 0.02).to(dev, dtype)
    y = torch.randint(0, z.vocab, (z.n,), generator=g).to(dev)
    g_lp, g_ent = torch.randn(z.n, generator=g).to(dev), torch.randn(z.n, generator=g).to(dev) / 100
    out = {
        "tokens": z.n,
        "hidden": z.h,
        "vocab": z.vocab,
        "dtype": str(dtype),
        "chunk": z.chunk,
        "what": "LM head only: log-prob + entropy, forward + backward (grads to h and W)",
    }

    def chunked(fused: bool):
        def fn(h, w):  # per-chunk work compiled (CUDA default) or eager
            return chunked_logprobs_entropy(h, w, y, chunk_size=z.chunk, fused=fused)

        return fn

    methods = {"chunked_eager": chunked(False), "chunked": chunked(True),
               "naive": lambda h, w: _naive_logprobs(h, w, y)}  # fmt: skip
    first = {}
    for name, fn in methods.items():
        try:
            out[name], first[name] = _head_step(fn, h0, w0, y, g_lp, g_ent, dev, z.iters)
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
        speed = f"{v['tok_s'] / 1e3:.1f}k | {v['mfu']:.1%}"
        return [
            (f"{key}{gc_tag} tok/s | MFU", speed, ""),
            (f"{key} peak GiB", fmt(v["peak_gib"]), ""),
        ]

    return variant_rows(res["variants"], rows_of)


def logprob_rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of ``logprob_memory`` for the final table."""
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
