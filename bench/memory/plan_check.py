"""The memory plan against the measured peak, per phase, for the configs users run.

    python -m bench plan-check --gguf /root/work/qwen2.5-coder-0.5b-instruct.gguf \\
        --from-step-json bench/results/gsm8k_step_qwen05.json
    python -m bench plan-check --tiny --device cpu --configs seed,seed-mb4   # CPU check

Configs (``--configs``):

- ``seed``: ``examples/single_card_ppo.yaml`` verbatim (PPO + LoRA r8 on Qwen2-7B, HF
  ``generate``, no gradient checkpointing, critic and reward model = the actor's path)
  through ``danka train --config_file ... --seed 42`` with the three model paths pointed at
  one random Qwen2-7B-shaped checkpoint (bf16, written once by bench/lib/ppo_memory.py's
  ``save_checkpoint``; tokenizer from ``--gguf``'s Qwen2.5), the seed's own data
  (``danka data seed-mini`` on ``--gsm8k-data``), ``speed.gpu_memory=24GiB``,
  ``trainer.micro_batch_size=auto``, 3 steps; ``seed-mb4``: micro-batch 4 and no cap;
  ``seed-shipped``: the file's own micro-batch 2 under the 24 GiB cap.
- ``small-card``: ``python -m bench small-card --budget 24GiB`` (the 7B bench config: fast
  engine, gradient checkpointing, 4 x 512 + 128 tokens, micro-batch auto); its plan per
  phase is bench/lib/ppo_memory.py's estimate at the planned micro-batch.
- ``qwen05-grpo``, ``qwen05-ppo``: ``examples/gsm8k_{grpo,ppo}.yaml`` on the real model
  (``--gguf``): read from ``python -m bench train --only gsm8k_step``'s JSON
  (``--from-step-json``), else measured here by ``danka train`` for 3 steps.

Plan: ``danka estimate CONFIG OVERRIDES --json`` for the same settings (the budget the run
plans with); measured: the loop's own per-phase peaks (``memory/<phase>_peak_gib``, max over
the steps; ``torch.cuda.max_memory_allocated``). Per phase (prepare = max of log-probs and
values) and for the step: (plan - measured) / measured; ``ok`` when within 10%, what
``tests/bench/memory/test_plan_gpu.py`` asserts. The runs only measure memory, so with
``--parallel`` they share the GPU at once (their step times then mean little).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.lib.common import (
    ROOT,
    add_output_args,
    bench_command,
    child_env,
    environment,
    error_text,
    fmt,
    free,
    parser,
    write_result,
)
from bench.lib.gsm8k_data import data_path
from bench.lib.ppo_memory import (
    SIZES,
    compare,
    read_estimate,
    save_checkpoint,
    start_estimate,
    step_overrides,
    with_estimate,
)

SEED = ROOT / "examples" / "single_card_ppo.yaml"
TOLERANCE = 0.10
SEED_RUNS = {  # name -> the overrides after the three model paths
    "seed": ["speed.gpu_memory=24GiB", "trainer.micro_batch_size=auto"],
    "seed-mb4": ["trainer.micro_batch_size=4"],
    "seed-shipped": ["speed.gpu_memory=24GiB"],
}
QWEN_RUNS = {"qwen05-grpo": "gsm8k_grpo.yaml", "qwen05-ppo": "gsm8k_ppo.yaml"}
CONFIGS = (*SEED_RUNS, "small-card", *QWEN_RUNS)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "vocab.json", "merges.txt")  # fmt: skip


# ------------------------------------------------------------------------ inputs


def qwen_folder(args) -> str | None:
    """``--gguf`` as the HF folder danka converts it to (None without one)."""
    if not args.gguf:
        return None
    if not args.gguf.endswith(".gguf"):
        return args.gguf
    from danka.models.gguf import ensure_converted

    return str(ensure_converted(args.gguf))


def seed_checkpoint(args, dev: torch.device, work: Path) -> Path:
    """One random Qwen2-7B-shaped checkpoint for the three model paths, with Qwen2.5's
    tokenizer (``--tiny``: a tiny model and tokenizer)."""
    from danka.models import tiny

    if args.tiny:
        return tiny.save_tiny_model(work / "tiny_7b")
    tok = qwen_folder(args)
    if tok is None:
        raise ValueError("the seed configs need --gguf (its Qwen2.5 tokenizer)")
    from bench.lib.training import random_model

    base = random_model(tiny.qwen2_7b_config(), dev, torch.bfloat16)
    ckpt = save_checkpoint(args, base)
    del base
    free(dev)
    path = Path(ckpt["path"])
    for name in TOKENIZER_FILES:
        if (Path(tok) / name).is_file():
            shutil.copy(Path(tok) / name, path / name)
    return path


def seed_data(args, work: Path) -> Path:
    """The seed's ``./mini_gsm8k.json``: ``danka data seed-mini`` on GSM8K's train rows."""
    from danka.cli import main as danka_main

    out = work / "mini_gsm8k.json"
    src = data_path(args.gsm8k_data)
    if danka_main(["data", "seed-mini", "--input", str(src), "--output", str(out)]) != 0:
        raise RuntimeError("danka data seed-mini failed")
    return out


# ------------------------------------------------------------------------ the runs


def seed_command(args, name: str, ckpt: Path, work: Path) -> tuple[list[str], Path, list[str]]:
    """(``danka train`` command, its folder, its overrides) of a seed run: the file copied
    verbatim next to its data, the three model paths and ``SEED_RUNS[name]`` as overrides."""
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(SEED, folder / SEED.name)
    shutil.copy(work / "mini_gsm8k.json", folder / "mini_gsm8k.json")
    over = [f"model.{k}_model_name_or_path={ckpt}" for k in ("actor", "critic", "reward")]
    over += [f"trainer.total_steps={args.steps}", *SEED_RUNS[name]]
    if args.tiny:  # a CPU: no card to plan or cap, float32; the tiny char tokenizer has no
        # one-token "Yes" for the judge, so the tiny check scores with the gsm8k rule instead
        over = [o for o in over if not o.startswith("speed.gpu_memory")]
        over += ["model.torch_dtype=float32", f"model.device={args.device}",
                 "model.reward_model_name_or_path=null", "reward.functions=[{name: gsm8k}]"]  # fmt: skip
    cmd = [sys.executable, "-m", "danka", "train", "--config_file", SEED.name,
           "--output_dir", "./output", "--seed", "42", *over]  # fmt: skip
    return cmd, folder, over


def qwen_command(args, name: str, model: str, work: Path) -> tuple[list[str], Path, list[str]]:
    """``danka train`` on examples/gsm8k_*.yaml with the real model, 3 steps, no evaluation
    (``--tiny``: a few short samples on the CPU)."""
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    src = data_path(args.gsm8k_data)
    over = [f"model.actor_model_name_or_path={model}", f"data.train_dataset={src}",
            "data.eval_dataset=null", f"trainer.total_steps={args.steps}",
            "trainer.max_train_minutes=null", "checkpoint.save_minutes=null",
            "logging.tensorboard=false", "logging.progress=false"]  # fmt: skip
    if args.tiny:
        over += ["speed.gpu_memory=null", "model.torch_dtype=float32", "trainer.batch_size=2",
                 "trainer.mini_batch_size=1", "trainer.max_new_tokens=16"]  # fmt: skip
        over += ["trainer.samples_per_prompt=4"] if name == "qwen05-grpo" else []
    cfg = ROOT / "examples" / QWEN_RUNS[name]
    cmd = [sys.executable, "-m", "danka", "train", str(cfg), "--output-dir", "./output", *over]
    return cmd, folder, over


def measured(out_dir: Path) -> dict:
    """The loop's own per-phase peaks (max over the steps), step times and the micro-batch
    of the start-up line, from a ``danka train`` output folder."""
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x]
    rows = [r for r in rows if "time/step" in r]
    peaks: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("memory/") and k.endswith("_peak_gib"):
                name = k.removeprefix("memory/").removesuffix("_peak_gib")
                peaks[name] = max(peaks.get(name, 0.0), float(v))
        if "memory/peak_gib" in r:
            peaks["step"] = max(peaks.get("step", 0.0), float(r["memory/peak_gib"]))
    log = (out_dir / "logs" / "train.log").read_text()
    micro = re.search(r"micro-batch (\d+) sequences", log)
    auto = re.search(r"micro-batch \d+[^\n]*\(auto: [^\n]*\)", log)
    return {
        "steps": len(rows), "step_s": [r["time/step"] for r in rows],
        "phase_peak_gib": peaks or None, "micro_batch": int(micro.group(1)) if micro else None,
        "auto_line": auto.group(0) if auto else None,
        "oom_retries": log.count("out of memory in the "),
    }  # fmt: skip


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    """Start ``cmd`` in ``cwd``, its output to ``cwd/run.log``."""
    with (cwd / "run.log").open("w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdout=log, stderr=log)


def finish(proc: subprocess.Popen, cwd: Path, timeout: float) -> dict:
    """Wait for a run: its status (wall seconds, or the error and the log's tail)."""
    t0 = time.perf_counter()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = f"timed out after {timeout} s"
    if rc != 0:
        tail = (cwd / "run.log").read_text().splitlines()[-8:]
        return {"error": f"rc {rc}", "log_tail": tail}
    return {"wait_s": time.perf_counter() - t0}


def with_plan(res: dict, plan: dict) -> dict:
    """``res`` plus the plan, the per-phase comparison and ``ok`` (step within 10%)."""
    res["plan"] = plan
    if "error" not in plan and res.get("phase_peak_gib"):
        vs = res["vs_plan"] = compare(plan, res)
        err = vs["step"]["rel_error"]
        res["ok"] = None if err is None else abs(err) <= TOLERANCE
    return res


def small_card(args, work: Path, dev: torch.device) -> tuple[subprocess.Popen, Path]:
    cmd = bench_command("small-card", "--budget", args.budget, "--out-dir", str(work),
                        "--name", "plan_check_small_card", "--steps", str(args.steps))  # fmt: skip
    cmd += ["--tiny", "--device", "cpu"] if args.tiny else []
    folder = work / "small-card"
    folder.mkdir(parents=True, exist_ok=True)
    return start(cmd, folder), folder


def small_card_result(work: Path, dev: torch.device, tiny: bool) -> dict:
    """small-card's JSON with bench/lib/ppo_memory.py's estimate at its planned micro-batch."""
    from bench.lib.training import shape
    from danka.models import tiny as tiny_models

    res = json.loads((work / "plan_check_small_card.json").read_text())
    z = SimpleNamespace(**SIZES[1 if tiny else 0])
    over = step_overrides(z, dev, res["micro_batch_final"])
    engine = next(o.split("=")[1] for o in res["overrides"] if o.startswith("rollout.engine="))
    config, dtype = shape(SimpleNamespace(tiny=tiny), tiny_models.qwen2_7b_config)
    with_estimate(res, over, engine, z, dtype, config)
    plan = res.get("estimate", {"error": res.get("estimate_error")})
    res.pop("vs_estimate", None)
    return with_plan(res, plan)


def from_step_json(paths: str, algo: str) -> dict:
    """A ``gsm8k_step`` run's peaks and plan for ``algo``: the first of the comma-separated
    ``paths`` (bench train's JSONs) that holds it."""
    res, path = None, None
    for path in [x for x in paths.split(",") if x]:
        if not Path(path).is_file():
            continue
        data = json.loads(Path(path).read_text())
        sec = data["result"]["sections"].get("gsm8k_step", {}).get("results", {})
        res = sec.get("algos", {}).get(algo)
        if res is not None:
            break
    if res is None:
        return {"error": f"no gsm8k_step result for {algo} in {paths}"}
    if "error" in res:
        return {"error": res["error"]}
    out = {"source": path, "phase_peak_gib": res.get("phase_peak_gib"),
           "micro_batch": res.get("sizes", {}).get("micro_batch"),
           "overrides": res.get("overrides")}  # fmt: skip
    return with_plan(out, res.get("plan") or {"error": "no plan in the step's JSON"})


# ------------------------------------------------------------------------ main


def measure(args) -> dict:
    dev = torch.device(args.device)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown configs {sorted(unknown)} (use {', '.join(CONFIGS)})")
    work = Path(args.work_dir or (Path(args.out_dir) / "_plan_check"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out: dict = {"tolerance": TOLERANCE, "configs": {}}
    runs: dict[str, tuple] = {}  # name -> (proc, folder, plan proc, overrides)
    budget = None if args.tiny else "24GiB"
    seeds = [n for n in names if n in SEED_RUNS]
    ckpt = None
    if seeds:
        t0 = time.perf_counter()
        ckpt = seed_checkpoint(args, dev, work)
        seed_data(args, work)
        out["seed_checkpoint"] = {"path": str(ckpt), "s": time.perf_counter() - t0}
        for name in seeds:
            cmd, folder, over = seed_command(args, name, ckpt, work)
            capped = any(o.startswith("speed.gpu_memory") for o in over)
            plan = start_estimate(folder / SEED.name, over, budget if capped or args.tiny
                                  else None)  # fmt: skip
            runs[name] = (cmd, folder, plan, over)
    model = qwen_folder(args)
    for name in [n for n in names if n in QWEN_RUNS]:
        algo = name.split("-")[1]
        if args.from_step_json:
            out["configs"][name] = from_step_json(args.from_step_json, algo)
        elif model is None and not args.tiny:
            out["configs"][name] = {"error": "needs --gguf or --from-step-json"}
        else:
            ckpt = ckpt or seed_checkpoint(args, dev, work)  # --tiny: the tiny model
            model = model or str(ckpt)
            cmd, folder, over = qwen_command(args, name, model, work)
            plan = start_estimate(ROOT / "examples" / QWEN_RUNS[name], over, "24GiB")
            runs[name] = (cmd, folder, plan, over)
    write_result(
        {"bench": "plan-check", "partial": True, **out}, args.out_dir, args.name or "plan_check"
    )  # the rows read from gsm8k_step, at once
    procs: dict[str, subprocess.Popen] = {}
    card = None
    order = list(runs) + (["small-card"] if "small-card" in names else [])
    for name in order:  # in parallel, or one after the other
        if name == "small-card":
            card = small_card(args, work, dev)
            procs[name] = card[0]
        else:
            procs[name] = start(runs[name][0], runs[name][1])
        if not args.parallel:
            _collect(args, name, procs[name], runs, card, work, dev, out)
    if args.parallel:
        for name in order:
            _collect(args, name, procs[name], runs, card, work, dev, out)
    if ckpt is not None and not args.tiny:  # ~15 GB, in /dev/shm by default
        shutil.rmtree(ckpt, ignore_errors=True)
    return out


def _collect(args, name, proc, runs, card, work, dev, out) -> None:
    print(f"[plan-check] {name} ...", file=sys.stderr, flush=True)
    try:
        if name == "small-card":
            status = finish(proc, card[1], args.timeout)
            res = status if "error" in status else small_card_result(work, dev, args.tiny)
        else:
            cmd, folder, plan, over = runs[name]
            status = finish(proc, folder, args.timeout)
            res = {"command": cmd, "overrides": over, **status}
            if "error" not in status:
                res.update(measured(folder / "output"))
            with_plan(res, read_estimate(plan))
        res.update({k: v for k, v in status.items() if k == "wait_s"})
    except Exception as err:  # noqa: BLE001 - one config failing keeps the others
        res = {"error": error_text(err)}
    out["configs"][name] = res
    print(table_rows(name, res), flush=True)
    write_result(
        {"bench": "plan-check", "partial": True, **out}, args.out_dir, args.name or "plan_check"
    )  # a run cut short keeps what it measured


def table_rows(name: str, r: dict) -> str:
    if "error" in r and "vs_plan" not in r:
        return f"{name:<14} ERROR {r['error']} {r.get('log_tail', '')}"
    vs = r.get("vs_plan")
    if not vs:
        why = (r.get("plan") or {}).get("error") or "no GPU peaks measured"
        return f"{name:<14} no comparison: {str(why)[:120]}"
    cells = []
    for phase in ("rollout", "prepare", "update", "step"):
        v = vs[phase]
        cells.append(f"{fmt(v['estimate_gib']):>7}{fmt(v['measured_gib']):>7}"
                     f"{fmt(v['rel_error'], '{:+.0%}'):>6}")  # fmt: skip
    micro = r.get("micro_batch") or r.get("micro_batch_final")
    return f"{name:<14}{str(micro):>6}  " + " |".join(cells) + f"  {'ok' if r.get('ok') else 'OFF'}"


def parse(argv: list[str] | None):
    p = parser("plan-check", __doc__)
    p.add_argument("--configs", default="seed,seed-mb4,small-card,qwen05-grpo,qwen05-ppo",
                   help=f"comma list of {', '.join(CONFIGS)}")  # fmt: skip
    p.add_argument("--gguf", help="Qwen2.5-Coder-0.5B-Instruct (.gguf or its HF folder): the "
                   "qwen05 configs' model and the seed's tokenizer")  # fmt: skip
    p.add_argument("--gsm8k-data", default="data/gsm8k/train.jsonl", help="GSM8K train rows")
    p.add_argument("--from-step-json", help="bench train --only gsm8k_step's JSON(s), comma-"
                   "separated: the qwen05 rows from them instead of new runs")  # fmt: skip
    p.add_argument("--steps", type=int, default=3, help="steps per run")
    p.add_argument("--budget", default="24GiB", help="small-card's simulated card")
    p.add_argument("--parallel", action="store_true", help="all runs at once (memory only)")
    p.add_argument("--ckpt-dir", help="where the random 7B checkpoint goes (default /dev/shm)")
    p.add_argument("--work-dir", help="the runs' folders (default OUT_DIR/_plan_check)")
    p.add_argument("--tiny", action="store_true", help="tiny models on the CPU (tests)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_output_args(p, timeout=480)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    res = {"bench": "plan-check", "environment": environment(), **measure(args)}
    header = (f"{'config':<14}{'micro':>6}  " + " |".join(
        f"{ph + ' plan/meas':>20}" for ph in ("rollout", "prepare", "update", "step")))  # fmt: skip
    print("\nplan vs measured (GiB, (plan - measured) / measured)\n" + header)
    for name, r in res["configs"].items():
        print(table_rows(name, r))
    write_result(res, args.out_dir, args.name or "plan_check")
    return 0
