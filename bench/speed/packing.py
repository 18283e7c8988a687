"""Padding and packing: what share of computed tokens is real, and what ``speed.packing`` buys.

Sections of ``python -m bench train``:

- ``packing``: danka's effective-token ratio (length-grouped, trimmed micro-batches of 8) vs
  padding the whole batch to its longest prompt and response, and with ``speed.packing``
  (rows of 4,096 tokens); GSM8K lengths with ``--data`` (the model's tokenizer), else
  synthetic N(120, 40) / N(180, 80) lengths. A length computation: runs on a CPU.
- ``packing_step``: danka's GRPO update (log-probs with entropy, clipped policy loss,
  backward, fused AdamW; full-parameter, on-policy) on one GSM8K-like batch, with the
  default length-grouped, trimmed micro-batches vs ``speed.packing: true`` (each
  micro-batch's sequences packed into rows of ``speed.max_packed_length`` tokens, restarting
  position ids, block-diagonal attention). Same batch, same micro-batch size in sequences,
  random weights of the SmolLM2-135M and Qwen2.5-0.5B shapes (``--packing-shapes``).

  Lengths (synthetic, GSM8K-like): 8 prompts x 8 samples; prompt tokens uniform in
  [100, 200] (the same for a prompt's 8 samples), response tokens uniform in [50, 300].
  Variants ``--packing-variants mb<micro>[+pack][+gc]``; per variant: median step s over
  ``iters`` steps after a warm-up, real tokens/s, peak GiB, the effective-token ratio
  (real / computed tokens), and per shape ``packed_vs_padded`` = step-time ratio (padded /
  packed, > 1: packing is faster) and peak ratio for each micro-batch size measured both
  ways.
"""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import torch

from bench.lib import danka_side as ds
from bench.lib.common import error_text, fmt, free, peak_gib, reset_peak, timed
from bench.lib.training import gc_active, random_model, shape
from danka.config import load_config
from danka.models import tiny
from danka.models.lora import trainable_parameters
from danka.types import RolloutBatch


def _data_lengths(args) -> tuple[list[int], list[int]] | None:
    """(prompt tokens, answer tokens) per row of --data, with the model's tokenizer."""
    if not args.data or args.tiny:
        return None
    from danka.models.loading import load_tokenizer

    tok = load_tokenizer(args.model, log=lambda _: None)
    prompts, answers = [], []
    with open(args.data) as f:
        for i, line in enumerate(f):
            if i >= 2000:  # enough for the length distribution, keeps tokenizing to seconds
                break
            row = json.loads(line)
            msgs = [{"role": "user", "content": row["question"]}]
            prompts.append(
                len(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
            )
            answers.append(len(tok(row["answer"])["input_ids"]))
    return prompts, answers


def packing(args, dev: torch.device, log) -> dict:
    prompts_per_step, n, micro, batches = 8, 8, 8, (5 if args.tiny else 50)
    g = torch.Generator().manual_seed(0)
    lengths = _data_lengths(args)
    padded, danka, packed = [], [], []
    for _ in range(batches):
        if lengths:
            pi = torch.randint(0, len(lengths[0]), (prompts_per_step,), generator=g)
            ri = torch.randint(0, len(lengths[1]), (prompts_per_step * n,), generator=g)
            plen = torch.tensor(lengths[0])[pi].repeat_interleave(n)
            rlen = torch.tensor(lengths[1])[ri]
        else:  # GSM8K-like: prompt ~ N(120, 40), response ~ N(180, 80), same prompt for n samples
            plen = (
                (120 + 40 * torch.randn(prompts_per_step, generator=g))
                .round()
                .clamp(16, 400)
                .long()
            )
            plen = plen.repeat_interleave(n)
            rlen = (
                (180 + 80 * torch.randn(prompts_per_step * n, generator=g))
                .round()
                .clamp(1, 512)
                .long()
            )
        batch = padded_batch(plen, rlen, n)
        real = float(plen.sum() + rlen.sum())
        padded.append(real / (batch.size * (int(plen.max()) + int(rlen.max()))))
        danka.append(ds.effective_token_ratio(batch, micro))
        packed.append(ds.effective_token_ratio(batch, micro, pack_len=4096))
    return {"source": "data" if lengths else "synthetic N(120,40) / N(180,80)",
            "seqs_per_batch": prompts_per_step * n, "micro_batch": micro, "batches": batches,
            "padded_ratio": statistics.mean(padded), "danka_ratio": statistics.mean(danka),
            "packed_ratio": statistics.mean(packed), "goal": 0.95}  # fmt: skip


def padded_batch(plen: torch.Tensor, rlen: torch.Tensor, n: int) -> RolloutBatch:
    b, p, r = len(plen), int(plen.max()), int(rlen.max())
    cols_p, cols_r = torch.arange(p)[None, :], torch.arange(r)[None, :]
    return RolloutBatch(
        prompt_ids=torch.zeros(b, p, dtype=torch.long),
        prompt_mask=(cols_p >= p - plen[:, None]).long(),
        response_ids=torch.zeros(b, r, dtype=torch.long),
        response_mask=(cols_r < rlen[:, None]).float(),
        group_index=torch.arange(b) // n,
        truncated=torch.zeros(b, dtype=torch.bool),
    )


SHAPES = {"smollm2-135m": tiny.smollm2_135m_config, "qwen2-0.5b": tiny.qwen2_0_5b_config}
SIZES = (  # (real, --tiny)
    {"prompts": 8, "n": 8, "p": (100, 200), "r": (50, 300), "iters": 3, "pack": 4096},
    {"prompts": 2, "n": 4, "p": (8, 16), "r": (4, 24), "iters": 1, "pack": 64},
)


def gsm8k_like_batch(z: SimpleNamespace, vocab: int, seed: int = 0):
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
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, vocab, (b, p), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(0, vocab, (b, r), generator=g) * response_mask.long(),
        response_mask=response_mask,
        group_index=torch.arange(b) // z.n,
        truncated=torch.zeros(b, dtype=torch.bool),
    )
    return ds.train_batch(batch, torch.randn(b, r, generator=g) * response_mask)


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
        f"speed.packing={str(packing).lower()}", f"speed.max_packed_length={z.pack}",
    ])  # fmt: skip
    if not gc:
        base.gradient_checkpointing_disable()
    models = ds.wrap_models(cfg, base, log)
    run = ds.build_run_for_bench(cfg, models, dev, dtype, log)

    def step() -> None:
        ds.update_step(run, batch)

    step()  # warm-up: allocator, kernels, AdamW state
    reset_peak(dev)
    times = [timed(step, dev) for _ in range(z.iters)]
    s = statistics.median(times)
    real = int(batch.prompt_mask.sum() + batch.response_mask.sum())
    return {
        "micro_batch": micro,
        "packing": packing,
        "gc_active": gc_active(base),
        "step_s": s,
        "real_tok_s": real / s,
        "peak_gib": peak_gib(dev),
        "effective_token_ratio": ds.effective_token_ratio(batch, micro, ds.packed_length(run)),
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


def packing_step(args, dev: torch.device, log) -> dict:
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
            config, dtype = shape(args, SHAPES.get(name))
            base = random_model(config, dev, dtype)
            res["params"] = trainable_parameters(base)[1]
            batch = gsm8k_like_batch(z, config.vocab_size)
            res["real_tokens"] = int(batch.prompt_mask.sum() + batch.response_mask.sum())
        except Exception as err:  # noqa: BLE001 - the next shape still runs
            res["error"] = error_text(err)
            continue
        for variant in args.packing_variants.split(","):
            try:
                res["variants"][variant] = _one(args, dev, log, base, dtype, batch, z, variant)
            except Exception as err:  # noqa: BLE001 - e.g. out of memory without packing
                res["variants"][variant] = {"error": error_text(err)}
            free(dev)
        res["packed_vs_padded"] = _ratios(res["variants"])
        del base
        free(dev)
    return out


def packing_rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of ``packing`` for the final table."""
    rows = []
    rows.append(("padded to batch max", f"{res['padded_ratio']:.1%}", "seed story 35%"))
    rows.append(
        (
            f"danka micro-batch {res['micro_batch']}",
            f"{res['danka_ratio']:.1%}",
            "seed story 82%; goal >= 95%",
        )
    )
    rows.append(
        (
            f"danka speed.packing, micro-batch {res['micro_batch']}, rows of 4096",
            f"{res['packed_ratio']:.1%}",
            "goal >= 95%",
        )
    )
    return rows


def packing_step_rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of ``packing_step`` for the final table."""
    rows = []
    for shape_name, sh in res["shapes"].items():
        for key, v in sh.get("variants", {}).items():
            value = "ERROR" if "error" in v else (
                f"{fmt(v['step_s'], '{:.3f}')} s | {fmt(v['peak_gib'])} GiB | "
                f"{v['effective_token_ratio']:.0%} real")  # fmt: skip
            rows.append((f"{shape_name} {key}", value, v.get("error", "")[:60]))
        for key, r in sh.get("packed_vs_padded", {}).items():
            rows.append((f"{shape_name} {key} padded/packed step time",
                         fmt(r["padded_over_packed_step_time"]), ">1: packing faster"))  # fmt: skip
    return rows
