"""Training-side benchmarks of danka on one GPU: step time, update MFU, memory.

   python -m bench train --only update_05b,logprob_memory --update-variants mb16,mb16+gc
   python -m bench train --only ppo_7b --ppo-engines hf,fast --name train_ppo_7b
   python -m bench train --tiny --device cpu --only update_05b,packing   # CPU check

Sections (``--only a,b``), each failing on its own (the error goes to the JSON and table):

- ``grpo_step``: danka's GRPO step at TRL's settings (SmolLM2-135M-Instruct, 8 prompts x 8
  samples, 256 new tokens, LoRA r16 all-linear or full-parameter, gradient checkpointing,
  beta 0): median step time (first step excluded), per-phase times and peak memory.
- ``gsm8k_step``: danka's GRPO and PPO step of ``examples/gsm8k_*.yaml`` on the real model
  and GSM8K rows, per phase: time, tokens/s, MFU, peak, top CUDA kernels; variants;
  the memory plan against the peaks (``bench/speed/gsm8k_step.py``).
- ``update_05b`` and ``logprob_memory``: the full-parameter update and the log-prob head
  on the Qwen2.5-0.5B shape (``bench/speed/update_mfu.py``).
- ``ppo_7b``: the whole PPO step on the Qwen2-7B shape per rollout engine, against ``danka
  estimate`` (``bench/lib/ppo_memory.py``).
- ``packing`` and ``packing_step``: the effective-token ratio and the update with
  ``speed.packing`` on vs off (``bench/speed/packing.py``).

``--tiny --device cpu`` swaps every model for a small one (danka.models.tiny) and every size
for a small one, so each code path runs on a laptop; timings then mean nothing. The result
JSON (``train_<sections>.json`` unless ``--name``) is rewritten after every section, so a
run cut short keeps the sections it finished.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from bench.lib import danka_side as ds
from bench.lib.common import (
    add_output_args,
    environment,
    error_text,
    fmt,
    free,
    parser,
    variant_rows,
    write_result,
)
from bench.lib.ppo_memory import ppo_7b, ppo_rows
from bench.lib.training import gc_active, pick_size, run_steps, synthetic_gsm8k
from bench.speed.gsm8k_step import gsm8k_step, headline
from bench.speed.packing import packing, packing_rows, packing_step, packing_step_rows
from bench.speed.step_report import rows as gsm8k_step_rows
from bench.speed.update_mfu import logprob_memory, logprob_rows, update_05b, update_rows
from danka.config import load_config
from danka.models import tiny
from danka.models.loading import configure_attention_backends
from danka.models.lora import trainable_parameters

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
# (real, --tiny) sizes of grpo_step
GRPO_SIZES = (
    {"prompts": 8, "n": 8, "new": 256, "sentences": 8},
    {"prompts": 2, "n": 4, "new": 16, "sentences": 2},
)  # fmt: skip (real, --tiny)


def quiet_log(verbose: bool) -> logging.Logger:
    log = logging.getLogger("bench.train")
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    if not log.handlers:
        log.addHandler(logging.StreamHandler(sys.stderr))
    return log


def grpo_step(args, dev: torch.device, log) -> dict:
    z = pick_size(args, GRPO_SIZES)
    tmp = Path(tempfile.mkdtemp(prefix="bench_grpo_"))
    model = str(tiny.save_tiny_model(tmp / "model")) if args.tiny else args.model
    micro = 4 if args.tiny else args.grpo_micro
    data = args.data or str(synthetic_gsm8k(tmp / "gsm8k.jsonl", 64, z.sentences))
    out = {"model": model, "data": data if args.data else "synthetic", "prompts": z.prompts,
           "samples": z.n, "max_new_tokens": z.new, "micro_batch": micro, "variants": {}}  # fmt: skip
    for variant in args.grpo_variants.split(","):
        for engine in args.engine.split(","):
            key = f"{variant}/{engine}"
            overrides = grpo_overrides(args, dev, model, data, variant, engine, z, micro,
                                       tmp / key.replace("/", "_"))  # fmt: skip
            try:
                out["variants"][key] = _grpo_one(args, dev, log, overrides)
            except Exception as err:  # noqa: BLE001 - one variant failing keeps the others
                out["variants"][key] = {"error": error_text(err)}
            free(dev)
    return out


def grpo_overrides(args, dev, model, data, variant, engine, z, micro, out_dir) -> list[str]:
    """TRL's GRPO anchor as danka ``key=value`` overrides (beta 0, LoRA r16 all-linear)."""
    lora = variant == "lora"
    return [
        f"model.actor_model_name_or_path={model}", f"model.device={dev}",
        "model.use_gradient_checkpointing=true",
        "trainer.algorithm=grpo", f"trainer.batch_size={z.prompts}",
        f"trainer.samples_per_prompt={z.n}", f"trainer.micro_batch_size={micro}",
        f"trainer.max_new_tokens={z.new}", f"trainer.max_length={z.new + 768}",
        f"trainer.total_steps={args.steps}", "trainer.kl.coef=0", "trainer.temperature=1.0",
        f"trainer.lr={1e-5 if lora else 1e-6}", f"lora.enable_lora={str(lora).lower()}",
        "lora.lora_r=16", "lora.lora_alpha=32", "lora.target_modules=all-linear",
        f"rollout.engine={engine}", f"data.train_dataset={data}", "data.format=gsm8k",
        "data.eval_size=0", "data.overlong_prompt=truncate_left", "logging.tensorboard=false",
        "logging.progress=false", f"output_dir={out_dir}",
    ]  # fmt: skip


def _grpo_one(args, dev, log, overrides: list[str]) -> dict:
    cfg, base_dir = load_config(None, overrides)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = ds.build_run_from_config(cfg, base_dir, out_dir, log)
    policy = ds.policy_of(run)
    try:
        if args.train_mode:
            policy.train()
        res = run_steps(run, args.steps, dev)
        res["gc_active"] = gc_active(policy)
        trainable, total = trainable_parameters(policy)
        res["params"], res["trainable_params"] = total, trainable
    finally:
        ds.close_run(run)
    peaks = res["phase_peak_gib"]
    res["peak_gib"] = peaks.get("step") if peaks else None
    return res


def grpo_rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of ``grpo_step`` for the final table."""

    def rows_of(key: str, v: dict) -> list:
        ph, peaks = v["median"], v["phase_peak_gib"] or {}
        tag = f"{key} (gc {'on' if v['gc_active'] else 'OFF'})"
        phases = "/".join(
            fmt(ph.get(f"time/{k}")) for k in ("rollout", "reward", "logprobs", "update")
        )
        first = f"first step {fmt(v['first_step_s'])} s"
        return [
            (f"{tag} median step s", fmt(v["median_step_s"]), first),
            (f"{key} rollout/reward/logprobs/update s", phases, ""),
            (f"{key} peak GiB", fmt(v["peak_gib"]),
             f"rollout {fmt(peaks.get('rollout'))}, update {fmt(peaks.get('update'))}"),
        ]  # fmt: skip

    return variant_rows(res["variants"], rows_of)


# name -> (section, its table rows)
SECTIONS = {
    "grpo_step": (grpo_step, grpo_rows),
    "gsm8k_step": (gsm8k_step, gsm8k_step_rows),
    "update_05b": (update_05b, update_rows),
    "ppo_7b": (ppo_7b, ppo_rows),
    "logprob_memory": (logprob_memory, logprob_rows),
    "packing": (packing, packing_rows),
    "packing_step": (packing_step, packing_step_rows),
}


def print_table(report: dict) -> None:
    lines = []
    for name, sec in report["sections"].items():
        if sec["status"] != "ok":
            lines.append((name, "ERROR", sec["error"][:80]))
            continue
        try:
            for metric, value, ref in SECTIONS[name][1](sec["results"]):
                lines.append((name, f"{metric}: {value}", ref))
        except Exception as err:  # noqa: BLE001 - a table bug must not hide the JSON
            lines.append((name, "table error", error_text(err)))
        lines.append((name, f"wall {sec['wall_s']:.1f} s", ""))
    w0 = max(len(a) for a, _, _ in lines) if lines else 8
    w1 = max(len(b) for _, b, _ in lines) if lines else 8
    tiny_note = "  (TINY: timings meaningless)" if report["tiny"] else ""
    print(
        f"\ndanka training benchmark: {report['device']}  torch {report['torch']}  "
        f"transformers {report['transformers']}{tiny_note}"
    )
    print("-" * (w0 + w1 + 40))
    for a, b, c in lines:
        print(f"{a:<{w0}}  {b:<{w1}}  {c}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = parser("train", __doc__)
    ap.add_argument("--only", default="update_05b,ppo_7b,logprob_memory", help="sections: "
                    + ",".join(SECTIONS))  # fmt: skip
    ap.add_argument("--model", default=SMOLLM2, help="grpo_step policy (hub id or folder)")
    ap.add_argument("--gsm8k-model", help="gsm8k_step's model (.gguf or HF folder), also "
                    "update_05b's and logprob_memory's shape (and update_05b's weights) when "
                    "given")  # fmt: skip
    ap.add_argument("--gsm8k-data", default="data/gsm8k/train.jsonl", help="gsm8k_step rows")
    ap.add_argument("--step-algos", default="grpo,ppo", help="gsm8k_step: examples/gsm8k_<algo>")
    ap.add_argument("--step-steps", type=int, default=3, help="gsm8k_step: steps per algorithm "
                    "(1 warm-up; with --profile the last is profiled)")  # fmt: skip
    ap.add_argument("--step-set", action="append", default=[], metavar="KEY=VALUE",
                    help="gsm8k_step: a config override for every algorithm")  # fmt: skip
    ap.add_argument("--profile-phases", default="logprobs,values,update",
                    help="gsm8k_step: the phases profiled (rollout too: bench rollout profiles "
                    "it on its own)")  # fmt: skip
    ap.add_argument("--step-variants", default="base,mb16,mb32,mb32+gc,chunk512,chunk1024,"
                    "full,full+mb16", help="gsm8k_step: steps 4-7 at other sizes, "
                    "mbN|chunkN|gc|full joined by +")  # fmt: skip
    ap.add_argument("--variants-for", default="grpo", help="gsm8k_step: algorithms with variants")
    ap.add_argument("--variant-seqs", type=int, default=0, help="gsm8k_step: sequences a "
                    "variant trains (0: one mini-batch)")  # fmt: skip
    ap.add_argument(
        "--variants-budget-s",
        type=float,
        default=150.0,
        help="gsm8k_step: no variant starts after this many seconds of variants",
    )
    ap.add_argument("--data", help="GSM8K jsonl (question/answer); default synthetic prompts")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small models and sizes (CPU check)")
    ap.add_argument("--steps", type=int, default=6, help="grpo_step: train steps per variant")
    ap.add_argument("--engine", default="fast", help="grpo_step rollout engines: fast,hf")
    ap.add_argument("--grpo-variants", default="lora,full", help="lora,full")
    ap.add_argument("--grpo-micro", type=int, default=8, help="grpo_step micro-batch (seqs)")
    ap.add_argument(
        "--update-variants",
        default="mb16,mb8,mb16+gc,mb8+gc",
        help="update_05b: mb<micro-batch>[+gc][+compile][+eager_head][+lora][+varlen], "
        "comma-separated (+varlen: speed.packed_update, padding-free, LoRA in bf16; +chunkN: "
        "the log-prob head's chunk; +graphs: speed.cuda_graphs, with +varlen) "
        "(+compile: speed.compile, stays on for the variants after it; +peftlora: peft's "
        "LoRA forward instead of the fused layer; +eager_head: the "
        "log-prob head's per-chunk work eager instead of compiled)",
    )
    ap.add_argument(
        "--ppo-engines",
        default="hf,fast",
        help="ppo_7b rollout engines: hf, fast, hf-qlora (NF4 base through model.load_in_4bit)",
    )
    ap.add_argument("--ckpt-dir", help="ppo_7b qlora: where the random 7B checkpoint goes "
                    "(default /dev/shm when it has room, else the temp dir)")  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="update_05b, gsm8k_step: top "
                    "CUDA kernels")  # fmt: skip
    ap.add_argument("--update-shape", default="qwen2.5-0.5b", choices=["qwen2.5-0.5b",
                    "qwen2.5-coder-0.5b"], help="update_05b's random weights without "
                    "--gsm8k-model (coder: the untied output head)")  # fmt: skip
    ap.add_argument(
        "--update-seqs",
        type=int,
        default=0,
        help="update_05b: sequences of "
        "GSM8K-like lengths (the real step's shape; 0: 16 x 512 full-length)",
    )
    ap.add_argument("--head-responses", help="logprob_memory: response lengths, e.g. 512,1024 "
                    "(default: 8,192 rows at chunk 1024)")  # fmt: skip
    ap.add_argument("--head-micro", type=int, default=8, help="logprob_memory: sequences")
    ap.add_argument("--head-chunk", type=int, default=128, help="logprob_memory: chunk rows "
                    "with --head-responses")  # fmt: skip
    ap.add_argument("--packing-shapes", default="smollm2-135m,qwen2-0.5b", help="packing_step")
    ap.add_argument("--packing-variants", default="mb8,mb8+pack,mb16,mb16+pack,mb64,mb64+pack",
                    help="packing_step: mb<micro-batch>[+pack][+gc], comma-separated")  # fmt: skip
    ap.add_argument("--profile-steps", type=int, default=3, help="steps under the profiler")
    ap.add_argument("--ppo-micro", type=int, default=4, help="ppo_7b micro-batch (seqs)")
    ap.add_argument("--train-mode", action="store_true", help="policy in train mode (the "
                    "loader leaves eval mode, where HF skips gradient checkpointing)")  # fmt: skip
    ap.add_argument("--verbose", action="store_true", help="show danka's INFO log")
    add_output_args(ap)
    args = ap.parse_args(argv)
    if args.tiny:
        args.steps = min(args.steps, 3)
    return args


def run(args) -> dict:
    """Run the sections of ``args.only``; the report (and its JSON after each section)."""
    dev = torch.device(args.device)
    # as in every danka run: no cuDNN SDPA (its backward gave NaN gradients on padded rows,
    # and the sections build random models without danka's loader, which turns it off)
    configure_attention_backends()
    log = quiet_log(args.verbose)
    import transformers

    report = {"args": vars(args), "tiny": args.tiny, "torch": torch.__version__,
              "transformers": transformers.__version__,
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "sections": {}}  # fmt: skip
    result = {"bench": "train", "sections": args.only, "environment": environment(),
              "result": report}  # fmt: skip
    name = args.name or "train_" + args.only.replace(",", "_")

    def partial(section: str, results: dict) -> None:
        """What a long section measured so far, written now (a run cut short keeps it)."""
        report["sections"][section] = {"status": "partial", "results": results}
        write_result(result, args.out_dir, name)

    args.partial = partial
    for section in [s.strip() for s in args.only.split(",") if s.strip()]:
        t0 = time.perf_counter()
        if section not in SECTIONS:
            sec = {"status": "error", "error": f"unknown section (use {', '.join(SECTIONS)})"}
        else:
            print(f"[bench train] {section} ...", file=sys.stderr, flush=True)
            try:
                sec = {"status": "ok", "results": SECTIONS[section][0](args, dev, log)}
            except Exception as err:  # noqa: BLE001 - record, go on with the next section
                traceback.print_exc()
                sec = {"status": "error", "error": error_text(err)}
        sec["wall_s"] = time.perf_counter() - t0
        report["sections"][section] = sec
        result.update(headline(report))  # one GSM8K step's goal numbers, at the top
        free(dev)
        write_result(result, args.out_dir, name)  # partial results survive
    print_table(report)
    return result


def main(argv: list[str] | None = None) -> int:
    run(parse(argv))
    return 0
