"""``packing_step`` section of bench/bench_train.py: what ``data.packing`` buys on a GPU.

danka's GRPO update (``danka.trainer.update.update``: log-probs with entropy, clipped
policy loss, backward, fused AdamW; full-parameter, on-policy) on one GSM8K-like batch,
with the default length-grouped, trimmed micro-batches vs ``data.packing: true`` (each
micro-batch's sequences packed into rows of ``data.max_packed_length`` tokens, restarting
position ids, block-diagonal attention). Same batch, same micro-batch size in sequences,
random weights of the SmolLM2-135M and Qwen2.5-0.5B shapes (``--packing-shapes``).

Lengths (synthetic, GSM8K-like): 8 prompts x 8 samples; prompt tokens uniform in
[100, 200] (the same for a prompt's 8 samples), response tokens uniform in [50, 300].
Variants ``--packing-variants mb<micro>[+pack][+gc]``; per variant: median step s over
``iters`` steps after a warm-up, real tokens/s, peak GiB, the effective-token ratio
(real / computed tokens, ``danka.trainer.forward.effective_token_ratio``), and per shape
``packed_over_padded`` = step-time ratio (padded / packed, > 1: packing is faster) and
peak ratio for each micro-batch size measured both ways.
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import bench_train as bt
import torch

from danka.config import load_config
from danka.models import tiny
from danka.models.lora import count_parameters
from danka.trainer.forward import effective_token_ratio
from danka.trainer.models import build_models
from danka.trainer.update import update
from danka.types import RolloutBatch

SHAPES = {"smollm2-135m": tiny.smollm2_135m_config, "qwen2-0.5b": tiny.qwen2_0_5b_config}
SIZES = (  # (real, --tiny)
    {"prompts": 8, "n": 8, "p": (100, 200), "r": (50, 300), "iters": 3, "pack": 4096},
    {"prompts": 2, "n": 4, "p": (8, 16), "r": (4, 24), "iters": 1, "pack": 64},
)


def gsm8k_like_batch(z: SimpleNamespace, vocab: int, seed: int = 0) -> RolloutBatch:
    """Left-padded prompts, right-padded responses with the lengths of the module
    docstring; random ids, N(0, 1) advantages, on-policy (the update's own log-probs are
    pi_old)."""
    g = torch.Generator().manual_seed(seed)
    b = z.prompts * z.n
    plen = torch.randint(z.p[0], z.p[1] + 1, (z.prompts,), generator=g).repeat_interleave(z.n)
    rlen = torch.randint(z.r[0], z.r[1] + 1, (b,), generator=g)
    p, r = int(plen.max()), int(rlen.max())
    prompt_mask = (torch.arange(p)[None, :] >= p - plen[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < rlen[:, None]).float()
    return RolloutBatch(
        prompt_ids=torch.randint(0, vocab, (b, p), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(0, vocab, (b, r), generator=g) * response_mask.long(),
        response_mask=response_mask,
        group_index=torch.arange(b) // z.n,
        truncated=torch.zeros(b, dtype=torch.bool),
        advantages=torch.randn(b, r, generator=g) * response_mask,
        old_is_current=True,
    )


def parse_variant(variant: str) -> tuple[int, bool, bool]:
    """``mb16+pack+gc`` -> (16, packing, checkpointing)."""
    parts = variant.split("+")
    micro = int(parts[0].removeprefix("mb"))
    return micro, "pack" in parts[1:], "gc" in parts[1:]


def _one(args, dev, log, base, dtype, batch, z, variant: str) -> dict:
    micro, packing, gc = parse_variant(variant)
    micro = min(micro, z.prompts * z.n)  # --tiny: a batch of 8 sequences
    cfg, _ = load_config(None, [
        "model.actor_model_name_or_path=random:packing", f"model.device={dev}", "data.task=arithmetic",
        "trainer.algorithm=grpo", f"trainer.batch_size={z.prompts}",
        f"trainer.samples_per_prompt={z.n}", f"trainer.micro_batch_size={micro}",
        f"trainer.max_new_tokens={z.r[1]}", f"trainer.max_length={z.p[1] + z.r[1]}",
        "trainer.lr=1e-6", "trainer.kl.coef=0", "lora.enable_lora=false",
        f"model.use_gradient_checkpointing={str(gc).lower()}",
        f"data.packing={str(packing).lower()}", f"data.max_packed_length={z.pack}",
    ])  # fmt: skip
    if not gc:
        base.gradient_checkpointing_disable()
    models = build_models(cfg, base, lambda: None, log.info)
    run = bt.bare_run(cfg, models, dev, dtype, log)

    def step() -> None:
        update(run, batch, run.update_generator)

    step()  # warm-up: allocator, kernels, AdamW state
    bt.reset_peak(dev)
    times = [bt.timed(step, dev) for _ in range(z.iters)]
    s = statistics.median(times)
    real = int(batch.prompt_mask.sum() + batch.response_mask.sum())
    return {
        "micro_batch": micro,
        "packing": packing,
        "gc_active": bt.gc_active(base),
        "step_s": s,
        "real_tok_s": real / s,
        "peak_gib": bt.peak_gib(dev),
        "effective_token_ratio": effective_token_ratio(batch, micro, run.pack_len),
    }


def _ratios(variants: dict) -> dict:
    """padded / packed step time and packed / padded peak, per micro-batch size."""
    out = {}
    for key, v in variants.items():
        twin = variants.get(key.replace("+pack", ""), {}) if "+pack" in key else {}
        if "step_s" in v and "step_s" in twin:
            out[key] = {
                "padded_over_packed_step_time": twin["step_s"] / v["step_s"],
                "packed_over_padded_peak": (
                    v["peak_gib"] / twin["peak_gib"] if v["peak_gib"] and twin["peak_gib"] else None
                ),
            }
    return out


def sec_packing_step(args, dev: torch.device, log) -> dict:
    z = SimpleNamespace(**SIZES[1 if args.tiny else 0])
    shapes = ["tiny"] if args.tiny else [s.strip() for s in args.packing_shapes.split(",")]
    out = {"lengths": f"prompt U{z.p}, response U{z.r} tokens, {z.prompts} x {z.n} sequences",
           "max_packed_length": z.pack, "iters": z.iters, "shapes": {}}  # fmt: skip
    for name in shapes:
        res: dict = {"variants": {}}
        out["shapes"][name] = res
        try:
            if not args.tiny and name not in SHAPES:
                raise ValueError(f"unknown shape {name!r} (use {', '.join(SHAPES)})")
            config, dtype = bt.shape(args, SHAPES.get(name))
            base = bt.random_model(config, dev, dtype)
            res["params"] = count_parameters(base)[1]
            batch = gsm8k_like_batch(z, config.vocab_size)
            res["real_tokens"] = int(batch.prompt_mask.sum() + batch.response_mask.sum())
        except Exception as err:  # noqa: BLE001 - the next shape still runs
            res["error"] = bt._err(err)
            continue
        for variant in args.packing_variants.split(","):
            try:
                res["variants"][variant] = _one(args, dev, log, base, dtype, batch, z, variant)
            except Exception as err:  # noqa: BLE001 - e.g. out of memory without packing
                res["variants"][variant] = {"error": bt._err(err)}
            bt.free(dev)
        res["packed_vs_padded"] = _ratios(res["variants"])
        del base
        bt.free(dev)
    return out
