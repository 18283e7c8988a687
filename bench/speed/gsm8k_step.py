"""Where the real GSM8K step's time goes: danka's GRPO and PPO step on the real model.

Section ``gsm8k_step`` of ``python -m bench train``:

    python -m bench train --only gsm8k_step --gsm8k-model qwen2.5-coder-0.5b-instruct.gguf \\
        --gsm8k-data data/gsm8k/train.jsonl --profile
    python -m bench train --tiny --device cpu --only gsm8k_step --profile   # CPU check

For each of ``--step-algos``: ``examples/gsm8k_<algo>.yaml`` as shipped (GSM8K prompts
through the chat template with the example's instruction, 512 new tokens, LoRA r32
all-linear, ``speed.gpu_memory: 24GiB``, micro-batch and log-prob chunk ``auto``), built by
``danka train``'s own builder with the model and data swapped in; no evaluation, no
checkpoint. 1 warm-up + ``--step-steps - 1`` timed steps; with ``--profile`` the last one
runs each phase of ``--profile-phases`` under ``torch.profiler`` (one profile per phase,
CUDA activity only), so the timings come from the unprofiled steps. Per phase: seconds,
share of the step, tokens (rollout: generated; the others: real prompt + response tokens),
tokens/s, model FLOPs and MFU (danka/models/flops.py states the formula), peak GiB (the loop's own
per-phase peaks, max over the steps) and the top 20 CUDA kernels with their share of the
phase. Next to it, the memory plan of the same config (``danka estimate --json``, run in a
child process while the GPU works) against the measured peaks.

Variants (``--step-variants``, for the algorithms of ``--variants-for``) rerun steps 4-7
(log-probs, values, advantages, update) on the first mini-batch of the last step's samples,
so every variant trains the same tokens: ``base`` (the run's planned sizes), ``mbN``
(micro-batch N), ``chunkN`` (log-prob chunk N), ``gc`` (gradient checkpointing on),
``full`` (full-parameter: a second run of the same config without LoRA, lr 1e-6), joined by
``+``. They run uncapped (a size that would not fit the 24 GiB card still shows its speed
and peak), once each, after the main steps compiled the log-prob head; none starts after
``--variants-budget-s`` seconds of variants.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.lib import danka_side as ds
from bench.lib.common import ROOT, error_text, fmt, free
from bench.lib.gsm8k_data import data_path
from bench.lib.kernel_profile import profiling
from bench.lib.ppo_memory import compare, read_estimate, start_estimate
from bench.speed.step_report import report
from bench.speed.step_variants import full_variants, lora_variants, parse_variant
from danka.config import load_config
from danka.models.flops import FORMULA, Counts, mfu, mfu_6nt
from danka.step.train_step import PHASES

EXAMPLES = ROOT / "examples"


def step_overrides(args, dev, algo: str, model: str, data: str, out_dir: Path) -> list[str]:
    """The example as shipped with the model and data swapped in; no evaluation, no
    checkpoint, ``--step-steps`` steps (``--tiny``: a few short samples on the CPU)."""
    over = [
        f"model.actor_model_name_or_path={model}", f"model.device={dev}",
        f"data.train_dataset={data}", "data.eval_dataset=null",
        f"trainer.total_steps={args.step_steps}", "trainer.max_train_minutes=null",
        "checkpoint.save_minutes=null", "logging.tensorboard=false", "logging.progress=false",
        f"output_dir={out_dir}",
    ]  # fmt: skip
    if args.tiny:
        over += ["trainer.batch_size=2", "trainer.mini_batch_size=1", "trainer.max_new_tokens=16",
                 "speed.gpu_memory=null", "model.torch_dtype=float32"]  # fmt: skip
        over += ["trainer.samples_per_prompt=4"] if algo == "grpo" else []
    return over + list(args.step_set)


def inputs(args, tmp: Path) -> tuple[str, str]:
    """(model folder, GSM8K jsonl): a .gguf converted once to its HF folder (what danka
    loads it as); ``--tiny``: a tiny model and synthetic GSM8K rows."""
    if args.tiny:
        from danka.models.tiny import save_tiny_model

        rows = tmp / "g.jsonl"  # short questions: the tiny tokenizer is one token a character
        rows.write_text("".join(json.dumps({"question": f"What is {i} + 3?",
                        "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"}) + "\n" for i in range(16)))  # fmt: skip
        return str(save_tiny_model(tmp / "model")), str(rows)
    if not args.gsm8k_model:
        raise ValueError("gsm8k_step needs --gsm8k-model (a .gguf file or an HF folder)")
    model = args.gsm8k_model
    if model.endswith(".gguf"):
        from danka.models.gguf import ensure_converted

        model = str(ensure_converted(model))
    data = data_path(args.gsm8k_data)
    if not data.is_file():
        raise FileNotFoundError(f"GSM8K rows not found: {args.gsm8k_data}")
    return model, str(data)


# ------------------------------------------------------------------------- the steps


def profiler_hook(dev, phases: set[str], phase_s: dict[str, float], profiles: dict):
    """A ``PhaseClock`` ``around`` hook for ``danka_side.step_result``: each phase in
    ``phases`` runs under its own profiler (CUDA activity only), its top 20 kernels as
    shares of ``phase_s[phase]`` (the unprofiled step's seconds) stored in ``profiles``.
    The phase's own errors propagate; a profiler failure is recorded and the step goes on.
    Should the device-only trace come back without kernels, the later phases record the
    CPU operators too."""
    cpu_ops = [False]

    @contextlib.contextmanager
    def around(phase: str):
        if phase not in phases:
            yield
            return
        cm = profiling(dev, steps=1, top=20, step_s=phase_s.get(phase), cpu_ops=cpu_ops[0])
        try:
            report = cm.__enter__()
        except Exception as err:  # noqa: BLE001 - the profiler, not the phase
            profiles[phase] = {"error": error_text(err)}
            yield
            return
        try:
            yield
        except BaseException as err:
            with contextlib.suppress(Exception):  # the phase's error wins
                cm.__exit__(type(err), err, err.__traceback__)
            raise
        try:
            cm.__exit__(None, None, None)
            profiles[phase] = report
            cpu_ops[0] = cpu_ops[0] or "note" in report  # no kernel seen: see above
        except Exception as err:  # noqa: BLE001 - the profiler, not the phase
            profiles[phase] = {"error": error_text(err)}

    return around


def step_record(result, run) -> dict:
    """One step's phase seconds and peaks, its tokens and each phase's model FLOPs."""
    b = result.scored.batch
    prompt, response = float(b.prompt_mask.sum()), float(b.response_mask.sum())
    passes = ds.logprob_passes(result.prepared) if result.prepared is not None else 0
    flops = ds.stages_of(run).phase_flops(result)  # the FLOPs of the step's perf/* metrics
    stats = result.scored.stats
    return {
        "seconds": dict(result.seconds), "peaks_gib": dict(result.peaks_gib),
        "sequences": b.size, "prompt_tokens": prompt, "response_tokens": response,
        "logprob_passes": passes, "flops": flops,
        "padding_efficiency": ds.packing_ratio(run, b),
        "reward_mean": stats.mean, "response_length_mean": stats.response_length,
        "truncated": stats.truncated,
    }  # fmt: skip


def phase_rows(rec: dict, counts: Counts) -> dict[str, dict]:
    """Per phase of a step record: seconds, share, tokens, tok/s, TFLOP, MFU, peak."""
    tokens = rec["prompt_tokens"] + rec["response_tokens"]
    per_phase_tokens = {"rollout": rec["response_tokens"], "logprobs": tokens, "update": tokens}
    if rec["flops"].get("values"):  # a critic's forward (GRPO has none)
        per_phase_tokens["values"] = tokens
    step_s = rec["seconds"].get("step")
    rows = {}
    order = [*PHASES, "step"] + sorted(set(rec["seconds"]) - {*PHASES, "step"})
    for phase in [p for p in order if p in rec["seconds"]]:
        s = rec["seconds"][phase]
        row: dict = {"s": s, "share": s / step_s if step_s else None,
                     "peak_gib": rec["peaks_gib"].get(phase)}  # fmt: skip
        n = per_phase_tokens.get(phase)
        if n is not None:
            row.update(tokens=n, tok_s=n / s if s else None)
        fl = rec["flops"].get(phase)
        if fl:
            row.update(tflop=fl / 1e12, mfu=mfu(fl, s))
        if phase == "update" and fl:
            row["mfu_6nt"] = mfu_6nt(counts, tokens, s)
        rows[phase] = row
    return rows


def measure_steps(args, dev, run, cfg) -> tuple[dict, object]:
    """``--step-steps`` steps (the last profiled with ``--profile``): the record of each,
    the phase table of the timed ones (median), peaks, profiles; and the last step's
    samples (for the variants)."""
    counts = Counts.of(ds.policy_of(run))
    n, records, profiles, last = args.step_steps, [], {}, None
    phases = {p.strip() for p in args.profile_phases.split(",") if p.strip()}
    for i in range(1, n + 1):
        profiled = args.profile and i == n and n > 1
        timed = records[1:] or records  # the unprofiled steps after the warm-up
        phase_s = _median_seconds(timed) if timed else {}
        hook = profiler_hook(dev, phases, phase_s, profiles) if profiled else None
        t0 = time.perf_counter()
        result = ds.step_result(run, i, hook)
        rec = step_record(result, run)
        rec.update(step=i, profiled=profiled, wall_s=time.perf_counter() - t0)
        records.append(rec)
        last = result.scored
        print(f"[gsm8k_step] step {i}: {fmt(rec['seconds'].get('step'))} s "
              f"({'profiled' if profiled else 'timed' if i > 1 else 'warm-up'})",
              file=sys.stderr, flush=True)  # fmt: skip
    timed = [r for r in records[1:] if not r["profiled"]] or records[1:] or records
    median = dict(timed[-1], seconds=_median_seconds(timed))
    peaks: dict[str, float] = {}
    for r in records:
        for k, v in r["peaks_gib"].items():
            peaks[k] = max(peaks.get(k, 0.0), v)
    if peaks:
        peaks["step"] = max(peaks.values())
    return {
        "params": vars(counts), "steps": records, "timed_steps": [r["step"] for r in timed],
        "phases": phase_rows(median, counts), "phase_peak_gib": peaks or None,
        "profile": profiles,
    }, last  # fmt: skip


def _median_seconds(records: list[dict]) -> dict[str, float]:
    import statistics

    keys = {k for r in records for k in r["seconds"]}
    return {k: statistics.median(r["seconds"].get(k, 0.0) for r in records) for k in keys}


# ------------------------------------------------------------------------- the section


def one_algo(args, dev, log, algo: str, model: str, data: str, tmp: Path, out: dict, save):
    """One algorithm's steps, plan and variants into ``out``; ``save()`` writes what is
    measured so far."""
    config = EXAMPLES / f"gsm8k_{algo}.yaml"
    over = step_overrides(args, dev, algo, model, data, tmp / algo)
    cfg, base_dir = load_config(str(config), over)
    budget = cfg.speed.gpu_memory or ("24GiB" if dev.type != "cuda" else None)
    plan_proc = start_estimate(config, over, budget)
    out.update(config=str(config.relative_to(ROOT)), overrides=over,
               lora=cfg.lora.enable_lora, lora_r=cfg.lora.lora_r)  # fmt: skip
    t = cfg.trainer
    specs = [(s, parse_variant(s)) for s in args.step_variants.split(",") if s.strip()]
    if algo not in args.variants_for.split(","):
        specs = []
    run = ds.build_run_from_config(cfg, base_dir, Path(cfg.output_dir), log)
    try:
        out["sizes"] = {
            "prompts": t.batch_size, "samples_per_prompt": t.samples_per_prompt,
            "max_new_tokens": t.max_new_tokens, "micro_batch": ds.micro_batch(run),
            "logprob_chunk": ds.logprob_chunk(run), "mini_batch_prompts": t.mini_batch_size,
            "ppo_epochs": t.ppo_epochs, "gpu_memory": cfg.speed.gpu_memory,
        }  # fmt: skip
        res, scored = measure_steps(args, dev, run, cfg)
        out.update(res)
        phases = res["phases"]  # the headline: the step, its update's MFU, its peak
        out.update(
            median_step_s=phases.get("step", {}).get("s"),
            update_mfu=phases.get("update", {}).get("mfu"),
            peak_gib=(res["phase_peak_gib"] or {}).get("step"),
            packed_update=ds.stages_of(run).updating.forward.varlen,
        )
        out["micro_batch_after"] = ds.micro_batch(run)
        out["plan"] = read_estimate(plan_proc)
        if "error" not in out["plan"] and out.get("phase_peak_gib"):
            out["vs_plan"] = compare(out["plan"], out)
        save()
        if specs:
            mini = (t.mini_batch_size or t.batch_size) * t.samples_per_prompt
            scored = ds.first_rows(scored, min(mini, args.variant_seqs or mini))
            out["variants_on"] = {"sequences": scored.batch.size,
                                  "of": out["steps"][-1]["sequences"]}  # fmt: skip
            out["variants"], t0 = {}, time.perf_counter()
            lora = [(s, v) for s, v in specs if not v["full"]]
            base_micro = lora_variants(args, dev, run, cfg, scored, args.step_steps + 1, lora,
                                       out["variants"], t0, save)  # fmt: skip
    finally:
        ds.close_run(run)
    del run
    free(dev)
    full = [(s, v) for s, v in specs if v["full"]]
    if full:
        full_variants(args, dev, log, config, over, scored, args.step_steps + 1, full,
                      base_micro, out["variants"], t0, save)  # fmt: skip


HEADLINE = ("median_step_s", "update_mfu", "peak_gib")


def headline(report: dict) -> dict:
    """The step goals' numbers (``HEADLINE``) of a ``bench train`` report that measured
    one algorithm's GSM8K step, for the file's top level; {} otherwise."""
    algos = report["sections"].get("gsm8k_step", {}).get("results", {}).get("algos", {})
    if len(algos) != 1:
        return {}
    (one,) = algos.values()
    return {k: one[k] for k in HEADLINE if k in one}


def gsm8k_step(args, dev: torch.device, log) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench_gsm8k_step_"))
    model, data = inputs(args, tmp)
    out: dict = {"model": args.gsm8k_model or "tiny", "model_folder": model, "data": data,
                 "flops_formula": FORMULA, "algos": {}}  # fmt: skip
    partial = getattr(args, "partial", None)  # bench train's: writes the JSON as it goes

    def save() -> None:
        if partial is not None:
            partial("gsm8k_step", out)

    for algo in [a.strip() for a in args.step_algos.split(",") if a.strip()]:
        print(f"[gsm8k_step] {algo} ...", file=sys.stderr, flush=True)
        out["algos"][algo] = {"status": "running"}
        try:
            one_algo(args, dev, log, algo, model, data, tmp, out["algos"][algo], save)
            out["algos"][algo].pop("status")
        except Exception as err:  # noqa: BLE001 - one algorithm failing keeps the other
            import traceback

            traceback.print_exc()
            out["algos"][algo] = {"error": error_text(err)}
        free(dev)
        print(report(algo, out["algos"][algo]), flush=True)
    return out
