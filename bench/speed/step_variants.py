"""The step's variants (section ``gsm8k_step`` of ``python -m bench train``): steps 4-7
(log-probs, values, advantages, update) rerun at other sizes on the same scored samples.

A variant is named by parts joined with ``+``: ``base`` (the run's planned sizes), ``mbN``
(micro-batch N), ``chunkN`` (log-prob chunk N), ``gc`` (gradient checkpointing on), ``graphs``
(``speed.cuda_graphs`` on), ``fusednorm`` (RMSNorm through ``F.rms_norm``:
danka.models.fused_norm), ``full`` (full-parameter: a second run of the same config without
LoRA, lr 1e-6). The LoRA ones run on the step's own run, the full-parameter ones on a second
run built after it is freed; all uncapped (a size that would not fit the card still shows its
speed and peak), once each, and none starts after ``--variants-budget-s`` seconds of variants.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from bench.lib import danka_side as ds
from bench.lib.common import error_text, free
from danka.config import load_config
from danka.models import body_graphs
from danka.models.flops import Counts, mfu, mfu_6nt, phase_flops

TRAINED = ("logprobs", "values", "update")  # the phases a variant reruns (+ advantages)


def parse_variant(spec: str) -> dict:
    """``mb16+gc`` -> {"micro": 16, "chunk": None, "gc": True, "graphs": False,
    "fusednorm": False, "full": False}."""
    out: dict = {
        "micro": None,
        "chunk": None,
        "gc": False,
        "graphs": False,
        "fusednorm": False,
        "full": False,
    }
    for part in spec.split("+"):
        if part.startswith("mb"):
            out["micro"] = int(part[2:])
        elif part.startswith("chunk"):
            out["chunk"] = int(part[5:])
        elif part in ("gc", "graphs", "fusednorm", "full"):
            out[part] = True
        elif part != "base":
            raise ValueError(
                f"unknown variant part {part!r} in {spec!r} "
                "(mbN, chunkN, gc, graphs, fusednorm, full)"
            )
    return out


def variant_one(dev, run, cfg, scored, step: int, v: dict, base_micro: int) -> dict:
    """Steps 4-7 on ``scored`` at the variant's sizes; the run's sizes restored after."""
    counts = Counts.of(ds.policy_of(run))
    micro = v["micro"] or base_micro
    ds.set_micro_batch(run, micro)
    graphs_before = ds.cuda_graphs_on(run)
    ds.set_cuda_graphs(run, v["graphs"] or graphs_before)
    if v["gc"]:
        ds.set_checkpointing(run, True)
    ds.fuse_norms(v["fusednorm"], *ds.run_models(run))
    try:
        seconds, peaks, prepared = ds.prepare_and_update(run, scored, step, chunk=v["chunk"])
    finally:
        if v["gc"] and not cfg.model.use_gradient_checkpointing:
            ds.set_checkpointing(run, False)
        after = ds.micro_batch(run)
        ds.set_micro_batch(run, base_micro)
        ds.set_cuda_graphs(run, graphs_before)
        ds.fuse_norms(False, *ds.run_models(run))
    b = scored.batch
    prompt, response = float(b.prompt_mask.sum()), float(b.response_mask.sum())
    flops = phase_flops(
        counts, prompt=prompt, response=response, sequences=b.size,
        logprob_passes=ds.logprob_passes(prepared), critic=ds.needs_critic(run),
        full=v["full"], epochs=cfg.trainer.ppo_epochs,
    )  # fmt: skip
    seconds["trained"] = sum(seconds.get(p, 0.0) for p in TRAINED)
    rec = {"micro_batch": micro, "micro_batch_after": after,
           "logprob_chunk": v["chunk"] or ds.logprob_chunk(run), "gc": v["gc"],
           "cuda_graphs": v["graphs"] or graphs_before, "fused_norm": v["fusednorm"],
           "graph_failures": list(body_graphs.failures),
           "full": v["full"], "sequences": b.size, "tokens": prompt + response,
           "seconds": seconds, "peaks_gib": peaks,
           "peak_gib": max(peaks.values()) if peaks else None, "flops": flops}  # fmt: skip
    rec["phases"] = {
        p: {"s": seconds.get(p), "tok_s": (prompt + response) / seconds[p] if seconds.get(p)
            else None, "mfu": mfu(flops[p], seconds.get(p)) if flops.get(p) else None}
        for p in TRAINED if p in seconds and (p != "values" or flops["values"])
    }  # fmt: skip
    if v["full"]:
        rec["phases"]["update"]["mfu_6nt"] = mfu_6nt(counts, prompt + response, seconds["update"])
    return rec


def lora_variants(args, dev, run, cfg, scored, step: int, specs, out: dict, t0: float, save):
    """The variants of ``specs`` that keep the run's LoRA, on ``run``, uncapped; the run's
    planned micro-batch (the full-parameter variants start from it too)."""
    base_micro = ds.micro_batch(run)
    if dev.type == "cuda":
        ds.cap_process(1 << 60, dev)  # uncapped: see the module docstring
    for spec, v in specs:
        out[spec] = _guarded(args, t0, lambda v=v: variant_one(
            dev, run, cfg, scored, step, v, base_micro))  # fmt: skip
        save()
    return base_micro


def full_variants(args, dev, log, config, over, scored, step, specs, base_micro, out, t0, save):
    """The full-parameter variants on a second run of the same config without LoRA (lr
    1e-6, uncapped), built after the LoRA run was freed."""
    if time.perf_counter() - t0 > args.variants_budget_s:
        out.update({spec: {"skipped": "variants budget spent"} for spec, _ in specs})
        return
    try:
        extra = ["lora.enable_lora=false", "optim.lr=1e-6", "speed.gpu_memory=null"]
        cfg, base_dir = load_config(str(config), over + extra)
        run = ds.build_run_from_config(cfg, base_dir, Path(cfg.output_dir), log)
    except Exception as err:  # noqa: BLE001
        out.update({spec: {"error": error_text(err)} for spec, _ in specs})
        return
    try:
        for spec, v in specs:
            out[spec] = _guarded(args, t0, lambda v=v: variant_one(
                dev, run, cfg, scored, step, v, base_micro))  # fmt: skip
            save()
    finally:
        ds.close_run(run)


def _guarded(args, t0: float, fn) -> dict:
    if time.perf_counter() - t0 > args.variants_budget_s:
        return {"skipped": "variants budget spent"}
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - one variant failing keeps the others
        return {"error": error_text(err)}
    finally:
        free(torch.device("cuda") if torch.cuda.is_available() else "cpu")
