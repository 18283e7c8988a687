"""vLLM vs danka's fast engine (and HF), head to head on one GPU, into one JSON.

    python -m bench vllm --model qwen2.5-coder-0.5b-instruct.gguf   # or a folder, a hub id
    python -m bench vllm --model M --only grpo --grpo-engines vllm,fast --resume
    python -m bench vllm --tiny --device cpu          # CPU check of the plumbing
    bash bench/gpu/vllm.sh ...                        # on the H200, through 64 MiB calls

1. ``rollout``: ``python -m bench rollout`` at every cell of ``--prompts`` (64,256) x
   ``--eos`` (off,on), ``--new-tokens`` 512, sides ``--sides`` (vllm, fast-triton,
   hf-static; vllm-lora-merge, vllm-lora-adapter and the fast sides' ``--lora`` on
   request), each side in its own fresh process: tok/s, first call, peak
   memory (torch's peak and the device's used bytes), log-prob gap, greedy agreement, and
   every ratio with both sides. EOS off: every sequence generates all tokens (same work);
   EOS on: chat-formatted GSM8K-style questions, stop at the tokenizer's stop ids.
2. ``grpo``: one ``danka train`` step loop per engine (``--grpo-engines``) on
   ``examples/gsm8k_grpo.yaml`` (as it is: LoRA r32 all-linear, 64 prompts x 8 samples,
   512 new tokens, two optimiser steps a rollout, planned for a 24 GiB card by its
   ``speed.gpu_memory``; ``--grpo-set speed.gpu_memory=null`` plans for the whole GPU) with the model and data given, each engine in its own process: median step time
   (first step excluded), per-phase times and per-phase peak memory as the loop measures
   them.

A side where vLLM cannot run (not installed, torch pin, no GPU) is recorded as skipped with
the reason. The JSON is rewritten after every cell and engine; ``--resume`` keeps what a
previous run of the same ``--name`` finished (several shorter runs make one result).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path

from bench.lib.common import (
    add_output_args,
    bench_command,
    environment,
    error_text,
    parser,
    run_side,
    write_result,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_grpo.yaml"
# (real, --tiny) sizes of the GRPO step
GRPO_SIZES = ({}, {"trainer.batch_size": 2, "trainer.samples_per_prompt": 2,
                   "trainer.micro_batch_size": 2, "trainer.mini_batch_size": 2, "trainer.max_new_tokens": 8,
                   "trainer.max_length": 400, "data.overlong_prompt": "truncate_left",
                   "speed.gpu_memory": "null"})  # fmt: skip


def parse(argv):
    ap = parser("vllm", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="local folder or hub id of the policy")
    src.add_argument("--tiny", action="store_true", help="a tiny random model (CPU check)")
    ap.add_argument("--sides", default="vllm,fast-triton,hf-static")
    ap.add_argument("--prompts", default="64,256", help="sequences per cell, comma list")
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=160, help="EOS-off cells' prompt length")
    ap.add_argument("--eos", default="off,on", help="EOS off/on cells, comma list")
    ap.add_argument("--grpo-engines", default="vllm,fast")
    ap.add_argument("--grpo-steps", type=int, default=4, help="steps per engine (first excluded)")
    ap.add_argument(
        "--grpo-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another override of the GRPO config (repeatable)",
    )
    ap.add_argument("--data", help="GSM8K jsonl (question/answer); default: synthetic rows")
    ap.add_argument("--only", choices=["rollout", "grpo"], help="one part only")
    ap.add_argument("--resume", action="store_true", help="keep what --name already has")
    ap.add_argument("--device", default=None, help="default: cuda when torch sees it")
    ap.add_argument("--grpo-side", help="(internal) run one engine's GRPO steps")
    ap.add_argument("--out", help="(with --grpo-side) the side's JSON")
    add_output_args(ap, timeout=1800)
    return ap.parse_args(argv)


def cells(args) -> list[tuple[int, bool]]:
    eos = [e.strip() == "on" for e in args.eos.split(",")]
    return [(int(p), e) for p in args.prompts.split(",") for e in eos]


def cell_name(prompts: int, eos: bool, new_tokens: int) -> str:
    return f"{prompts}x{new_tokens}_eos_{'on' if eos else 'off'}"


def rollout_cell(args, prompts: int, eos: bool, model: str | None) -> dict:
    """``python -m bench rollout``'s comparison at one cell (its sides in fresh processes)."""
    from bench.speed import rollout

    argv = ["--sides", args.sides, "--prompts", str(prompts), "--new-tokens", str(args.new_tokens),
            "--prompt-len", str(args.prompt_len), "--device", args.device,
            "--out-dir", str(Path(args.out_dir) / "_vllm_cells"), "--timeout", str(args.timeout)]  # fmt: skip
    argv += ["--model", model] if model else ["--shape", "tiny", "--dtype", "float32"]
    argv += ["--eos", "on" if eos else "off"]
    return rollout.compare(rollout.parse(argv))


def grpo_overrides(args, engine: str, model: str, data: str, out_dir: Path) -> list[str]:
    """The GSM8K example as it is, but: this model and data, this engine, a few steps, no
    evaluation, checkpoint or log files."""
    sizes = GRPO_SIZES[1 if args.tiny else 0]
    return [
        f"model.actor_model_name_or_path={model}", f"model.device={args.device}",
        f"rollout.engine={engine}", f"trainer.total_steps={args.grpo_steps}",
        "trainer.max_train_minutes=null", f"data.train_dataset={data}",
        "data.eval_dataset=null", "data.eval_size=0", "checkpoint.save_steps=null",
        "checkpoint.save_minutes=null",
        "logging.tensorboard=false", "logging.progress=false", "logging.save_completions=0",
        f"output_dir={out_dir}",
        *[f"{k}={v}" for k, v in sizes.items()], *args.grpo_set,
    ]  # fmt: skip


def grpo_side(args) -> None:
    """This process runs ``args.grpo_side``'s GRPO steps and writes its JSON."""
    import torch

    from bench.lib import danka_side as ds
    from bench.lib.training import run_steps
    from bench.speed.train import synthetic_gsm8k
    from danka.config import load_config
    from danka.models import tiny

    tmp = Path(tempfile.mkdtemp(prefix="bench_vllm_grpo_"))
    model = str(tiny.save_tiny_model(tmp / "model", arch="qwen2")) if args.tiny else args.model
    data = args.data or str(synthetic_gsm8k(tmp / "gsm8k.jsonl", 512, 1 if args.tiny else 4))
    overrides = grpo_overrides(args, args.grpo_side, model, data, tmp / "run")
    cfg, base_dir = load_config(str(EXAMPLE), overrides)
    log = logging.getLogger("bench.vllm")
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler(sys.stderr))
    dev = torch.device(args.device)
    run = ds.build_run_from_config(cfg, base_dir, Path(cfg.output_dir), log)
    try:
        res = run_steps(run, args.grpo_steps, dev)
        if dev.type == "cuda":  # every allocation of this process, vLLM's included
            free_b, total_b = torch.cuda.mem_get_info(dev)
            res["device_used_gib"] = (total_b - free_b) / 2**30
            res["peak_reserved_gib"] = torch.cuda.max_memory_reserved(dev) / 2**30
    finally:
        ds.close_run(run)
    peaks = res["phase_peak_gib"] or {}
    res.update(engine=args.grpo_side, model=model, data=args.data or "synthetic",
               overrides=overrides, peak_gib=peaks.get("step"))  # fmt: skip
    Path(args.out).write_text(json.dumps(res, default=str))


def grpo_compare(args, res: dict) -> None:
    for engine in args.grpo_engines.split(","):
        if engine in res["grpo"] and "error" not in res["grpo"][engine]:
            continue  # --resume
        if engine == "vllm":
            from bench.speed.vllm_side import vllm_skip_reason

            if reason := vllm_skip_reason(args.device):
                res["grpo"][engine] = {"skipped": reason}
                continue
        cmd = bench_command("vllm", "--grpo-side", engine, "--device", args.device,
                            "--grpo-steps", str(args.grpo_steps))  # fmt: skip
        cmd += ["--tiny"] if args.tiny else ["--model", args.model]
        cmd += ["--data", args.data] if args.data else []
        cmd += [f"--grpo-set={kv}" for kv in args.grpo_set]
        out = Path(args.out_dir) / f"_grpo_{engine}.json"
        res["grpo"][engine] = run_side(cmd, out, args.timeout)
        out.unlink(missing_ok=True)
        save(args, res)
    steps = {e: v.get("median_step_s") for e, v in res["grpo"].items()}
    if steps.get("vllm") and steps.get("fast"):
        res["grpo_step_fast_over_vllm"] = steps["vllm"] / steps["fast"]  # > 1: fast is faster
    for key in ("peak_gib", "device_peak_gib"):  # torch's count; the device's (all bytes)
        peak = {e: v.get(key) for e, v in res["grpo"].items()}
        if peak.get("vllm") and peak.get("fast"):
            res[f"grpo_{key}_vllm_over_fast"] = peak["vllm"] / peak["fast"]  # goal: <= 1.10


def save(args, res: dict) -> None:
    write_result(res, args.out_dir, args.name or default_name(args))


def default_name(args) -> str:
    name = "tiny" if args.tiny else Path(args.model).name.lower().removesuffix(".gguf")
    return f"vllm_vs_fast_{name}"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.grpo_side:
        grpo_side(args)
        return 0
    path = Path(args.out_dir) / f"{args.name or default_name(args)}.json"
    res = json.loads(path.read_text()) if args.resume and path.exists() else {}
    res.update(bench="vllm", model=args.model or "tiny", new_tokens=args.new_tokens,
               settings="bf16; rollout cells: sampling temperature 1, n 1, each side in its own "
               "process; grpo: examples/gsm8k_grpo.yaml per engine in its own process")  # fmt: skip
    res.setdefault("rollout", {})
    res.setdefault("grpo", {})
    res["environment"] = environment()
    if args.only in (None, "rollout"):
        for prompts, eos in cells(args):
            name = cell_name(prompts, eos, args.new_tokens)
            done = res["rollout"].get(name, {}).get("sides", {})
            if done and not any("error" in v for v in done.values()):
                continue  # --resume
            try:
                res["rollout"][name] = rollout_cell(args, prompts, eos, args.model)
            except Exception as err:  # noqa: BLE001 - one cell failing keeps the others
                res["rollout"][name] = {"error": error_text(err)}
            save(args, res)
    if args.only in (None, "grpo"):
        grpo_compare(args, res)
    save(args, res)
    return 0
