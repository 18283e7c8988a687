"""Small cards simulated on a large one: the seed story's PPO step at the Qwen2-7B shape
under a memory budget, ``trainer.micro_batch_size: auto``.

    python -m bench small-card --budget 24GiB --name small_card_24gib
    python -m bench small-card --budget 12GiB --qlora --name small_card_12gib
    python -m bench small-card --budget 24GiB --engine hf --name small_card_24gib_hf

The process is capped to ``--budget`` (``torch.cuda.set_per_process_memory_fraction``, as
``speed.gpu_memory`` does in ``danka train``), the micro-batch comes from the memory plan
(``danka.planning.micro``), and the PPO step of ``python -m bench train --only ppo_7b``
runs (actor LoRA r8, critic LoRA + value head, reference = adapters off, gradient
checkpointing, KL 0.05, 4 prompts x 512 tokens + exactly 128 new tokens on a random base;
``--qlora``: an NF4 base loaded by danka's own path, HF ``generate``). The JSON keeps the
planned and the measured peak, the micro-batch planned and at the end, and how many
out-of-memory retries the run needed (``speed.auto_micro_batch``: each halves a size).
``--tiny --device cpu`` runs the same code on a tiny model (no budget: a CPU plans none).
"""

from __future__ import annotations

import logging
import time

import torch

from bench.lib import danka_side as ds
from bench.lib.common import GIB, add_output_args, environment, free, parser, write_result
from bench.lib.ppo_memory import (
    SIZES,
    qlora_overrides,
    random_prompts,
    save_checkpoint,
    step_overrides,
)
from bench.lib.training import pick_size, random_model, run_steps, shape
from danka.config import load_config
from danka.models import tiny
from danka.planning.inputs import PlanInput
from danka.planning.memory import OVERHEAD_BYTES
from danka.planning.micro import plan_memory
from danka.planning.shape import ModelShape
from danka.rollout.base import build_engine
from danka.schema.units import parse_memory


class _Retries(logging.Handler):
    """Counts the ``out of memory in the <phase>: ...`` warnings of the halving retries."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("out of memory in the "):
            self.lines.append(record.getMessage())


def overrides(args, dev: torch.device) -> list[str]:
    """The PPO step of ``bench train --only ppo_7b`` with ``micro_batch_size: auto``;
    ``--engine`` on a GPU (HF for QLoRA and on a CPU)."""
    engine = args.engine if dev.type == "cuda" and not args.qlora else "hf"
    return [*step_overrides(pick_size(args, SIZES), dev, "auto"), f"rollout.engine={engine}"]


def cap(dev: torch.device, budget: int | None) -> dict:
    """Cap this process to ``budget`` bytes of the GPU (what a smaller card would hold)."""
    if budget is None:
        return {"budget_gib": None}
    total = ds.cap_process(budget, dev)  # what speed.gpu_memory does in danka train
    return {"budget_gib": budget / GIB, "device_total_gib": total / GIB}


def measure(args) -> dict:
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config, dtype = shape(args, tiny.qwen2_7b_config)
    budget = parse_memory(args.budget) if dev.type == "cuda" else None
    over = overrides(args, dev)
    cfg, _ = load_config(None, over)
    ckpt = None
    if args.qlora:  # the plan prices what the run loads: an NF4 base
        cfg, _ = load_config(None, over + ["model.load_in_4bit=true"])
        # the random bf16 base is written before the cap (a 12 GiB card could not hold
        # it unquantized; a user's base comes from disk the same way)
        base = random_model(config, dev, dtype)
        ckpt = save_checkpoint(args, base)
        del base
        free(dev)
    res: dict = {"overrides": over, "qlora": args.qlora, **cap(dev, budget)}
    inp = PlanInput.of(cfg)
    model_shape = ModelShape.of(config, inp.target_modules, inp.lora_r)
    plan = plan_memory(inp, model_shape if budget is not None else None, budget)
    res["micro_batch_planned"] = plan.micro
    res["plan"] = plan.line() if plan.fits else str(plan.refusal())
    res["planned_peak_gib"] = None if plan.peak is None else plan.peak / GIB
    res["planned_with_overhead_gib"] = (
        None if plan.peak is None else (plan.peak + OVERHEAD_BYTES) / GIB
    )
    if not plan.fits:
        return res
    log = logging.getLogger("danka.bench.small_card")
    retries = _Retries()
    log.addHandler(retries)
    prompts, eos, pad = random_prompts(config, pick_size(args, SIZES))
    t0 = time.perf_counter()
    if ckpt is not None:
        cfg, _ = load_config(None, over + qlora_overrides(ckpt["path"]))
        models = ds.load_models(cfg, dev, log)
    else:
        models = ds.wrap_models(cfg, random_model(config, dev, dtype), log)
    res["load_s"] = time.perf_counter() - t0
    run = ds.build_run_for_bench(cfg, models, dev, dtype, log, prompts=prompts, eos=eos,
                                 pad=pad, sizes=plan)  # fmt: skip
    ds.set_engine(run, build_engine(cfg.rollout.engine))
    try:
        steps = run_steps(run, args.steps, dev)
    finally:
        ds.close_run(run)
    res.update(
        steps=args.steps,
        median_step_s=steps["median_step_s"],
        median_phase_s={k: v for k, v in steps["median"].items() if k.startswith("time/")},
        phase_peak_gib=steps["phase_peak_gib"],
        measured_peak_gib=(steps["phase_peak_gib"] or {}).get("step"),
        measured_reserved_gib=(
            torch.cuda.max_memory_reserved(dev) / GIB if dev.type == "cuda" else None
        ),
        micro_batch_final=ds.micro_batch(run),
        oom_retries=len(retries.lines),
        oom_lines=retries.lines,
    )
    if res["measured_peak_gib"] and res["planned_peak_gib"]:
        res["plan_error"] = (res["planned_peak_gib"] - res["measured_peak_gib"]) / res[
            "measured_peak_gib"
        ]
    return res


def main(argv: list[str] | None = None) -> int:
    p = parser("small-card", __doc__)
    p.add_argument("--budget", default="24GiB", help="the card to simulate, e.g. 24GiB, 12GiB")
    p.add_argument("--qlora", action="store_true", help="an NF4 base (bitsandbytes), HF generate")
    p.add_argument("--engine", default="fast", choices=["fast", "hf"],
                   help="the rollout engine on a GPU (QLoRA and a CPU: hf)")  # fmt: skip
    p.add_argument("--steps", type=int, default=3, help="PPO steps (the median skips the first)")
    p.add_argument("--tiny", action="store_true", help="a tiny Qwen2 (tests, CPU)")
    p.add_argument("--device", help="cuda (default when present) or cpu")
    p.add_argument("--ckpt-dir", help="--qlora: where the random base's checkpoint goes")
    add_output_args(p)
    args = p.parse_args(argv)
    res = {"bench": "small-card", "environment": environment(), **measure(args)}
    name = args.name or f"small_card_{args.budget.lower().replace('.', '_')}"
    write_result(res, args.out_dir, name)
    return 0
