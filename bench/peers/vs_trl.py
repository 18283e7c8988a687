"""GRPO step time and peak memory: TRL's GRPOTrainer vs ``danka train``, same settings.

    python -m bench trl --model HuggingFaceTB/SmolLM2-135M-Instruct --random-weights \
        --variants lora,full
    python -m bench trl --model PATH --variants full --sides danka \
        --danka-set rollout.lora_compute=adapter --danka-set speed.logprob_chunk_size=1024
    python -m bench trl --tiny --variants lora --prompts 2 --generations 2 --new-tokens 8 \
        --micro 4 --steps 2                      # CPU check of the bench
    python -m bench trl --model qwen2.5-coder-0.5b-instruct.gguf --task gsm8k \
        --prompts 32 --generations 8 --new-tokens 512 --micro 8 --steps 3   # the GSM8K shape

``--task gsm8k`` runs examples/gsm8k_grpo.yaml's settings on both sides (GSM8K questions with
its instruction through the chat template, verl's strict reward, its LoRA lr, rank and KL
coefficient as beta; full-parameter lr 1e-6; no gradient checkpointing), one optimizer step
per rollout; ``--prompts`` is the batch (the example's is 64: pick what lets TRL's steps
finish in the time there is; the JSON records it). A ``.gguf`` ``--model`` is converted once
(danka's ``ensure_converted``) and both sides load the HF folder: TRL cannot read GGUF.
TRL's rollout seconds are its ``generate`` calls inside each step (timed in its process).

Each variant and side runs in its own fresh process (``--side trl|danka``):

* ``--side trl``: TRL ``GRPOTrainer`` (HF ``generate`` rollout), ``--prompts`` prompts x
  ``--generations`` completions per optimizer step, ``--new-tokens`` max completion tokens,
  gradient checkpointing, bf16 on a GPU, ``beta=0`` (no reference model), LoRA r16
  all-linear (``--variant lora``) or full-parameter (``--variant full``); the step time is
  measured by a callback (``on_step_begin`` -> ``on_step_end``), peak =
  ``torch.cuda.max_memory_allocated``.
* ``--side danka``: ``danka train`` on a generated config with the same settings, in a
  subprocess; danka's own ``time/step`` and ``memory/peak_gib`` from its metrics.jsonl;
  ``--danka-set KEY=VALUE`` goes to it as its own overrides; side ``danka-eager`` runs it
  with the log-prob head's per-chunk work eager (an A/B of the fused head).

Both sides: the same prompts (one user message "What is a + b? Reply with only the number.",
rendered with the tokenizer's chat template by each side), the same rule reward (1 if the
last number is the sum), temperature 1, constant lr 1e-5 (full) / 2e-4 (LoRA), micro-batch
``--micro`` sequences, AdamW.
The median over the steps after the first (warm-up) is reported, with the mean completion
length of each side (EOS is on: a side that stops earlier does less work; compare tok/s too).
``--random-weights`` gives both sides ``--model``'s config, tokenizer and chat template with
random bf16 weights (seed 0): they never emit the end token, so both sides generate every
token of every answer (equal work). ``--tiny`` runs a tiny random model on the CPU (a smoke test of the script; timings mean
nothing). TRL is not a danka dependency: install it on the benchmark machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.lib.common import (
    ROOT,
    add_output_args,
    bench_command,
    child_env,
    parser,
    run_side,
    sides_folder,
    sides_main,
    write_result,
)
from bench.peers.trl_settings import (
    gsm8k_data,
    gsm8k_strict_reward,
    settings,
    time_generate,
    trl_rows,
)

PROMPT = "What is {a} + {b}? Reply with only the number.\n"


def prompts(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        msg = [{"role": "user", "content": PROMPT.format(a=a, b=b)}]
        rows.append({"prompt": msg, "answer": str(a + b)})
    return rows


def last_number_reward(completions, answer, **_) -> list[float]:
    """1.0 if the completion's last number equals the answer (danka's ``last_number``)."""
    out = []
    for text, truth in zip(completions, answer):
        if not isinstance(text, str):  # chat completions: [{"role": "assistant", ...}]
            text = " ".join(m.get("content", "") for m in text)
        nums = re.findall(r"-?\d+(?:\.\d+)?", text)
        out.append(float(bool(nums) and nums[-1] == truth))
    return out


def _peak_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**30


def side_trl(args, model_path: str, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available()
    times: list[float] = []
    lengths: list[float] = []
    gen_s: list[float] = []
    time_generate(gen_s, cuda)
    z = settings(args)

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            gen_s.append(0.0)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    seqs = args.prompts * args.generations
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=seqs // args.micro,
        num_generations=args.generations,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        beta=z["beta"],
        learning_rate=z["lr"],
        lr_scheduler_type="constant",
        gradient_checkpointing=z["gc"],
        bf16=cuda,
        use_cpu=not cuda,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        model_init_kwargs={"dtype": torch.bfloat16 if cuda else torch.float32},
    )
    peft_config = None
    if args.variant == "lora":
        peft_config = LoraConfig(r=z["lora_r"], lora_alpha=z["lora_alpha"],
                                 target_modules="all-linear")  # fmt: skip
    gsm8k = args.task == "gsm8k"
    n = args.prompts * args.steps
    data = Dataset.from_list(trl_rows(args, n) if gsm8k else prompts(n, args.seed))
    reward = gsm8k_strict_reward if gsm8k else last_number_reward
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward, args=config,
                          train_dataset=data, peft_config=peft_config,
                          callbacks=[Timer()])  # fmt: skip
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    import trl

    return {
        "step_s": times,
        "completion_len": lengths,
        "rollout_s": gen_s[: len(times)],
        "peak_gib": _peak_gib(),
        "trl": trl.__version__,
        "loss_type": config.loss_type,
        "settings": z,
    }


def danka_config(args, model_path: str, data_path: Path, out_dir: Path) -> dict:
    lora, task = args.variant == "lora", getattr(args, "task", "sum")
    z = settings(args)
    raw = {
        "model": {
            "actor_model_name_or_path": model_path,
            "torch_dtype": "auto",
            "use_gradient_checkpointing": z["gc"],
        },
        "trainer": {
            "algorithm": "grpo",
            "total_steps": args.steps,
            "batch_size": args.prompts,
            "samples_per_prompt": args.generations,
            "micro_batch_size": args.micro,
            "max_length": z["max_length"],
            "max_new_tokens": args.new_tokens,
            "lr": z["lr"],
            "temperature": 1.0,
            "kl": {"coef": z["beta"]},
        },
        "data": {"train_dataset": str(data_path), "format": "trl", "max_prompt_length": 128},
        "reward": {"functions": [{"name": "last_number"}]},
        "lora": {
            "enable_lora": lora,
            "lora_r": z["lora_r"],
            "lora_alpha": z["lora_alpha"],
            "target_modules": "all-linear",
        },
        "output_dir": str(out_dir),
    }
    if task == "gsm8k":  # the example's data and reward (its prompts: no length cap)
        raw["data"] = {"train_dataset": str(data_path), "format": "gsm8k",
                       "instruction": z["instruction"], "overlong_prompt": "drop"}  # fmt: skip
        raw["reward"] = {"functions": [{"name": "gsm8k",
                                        "kwargs": {"method": "strict", "format_score": 0.0}}]}  # fmt: skip
    return raw


def side_danka(args, model_path: str, work: Path) -> dict:
    import yaml

    if args.task == "gsm8k":
        data = gsm8k_data(args)
    else:
        data = work / "prompts.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in prompts(args.prompts * args.steps)))
    out_dir = work / "danka"
    cfg = work / "danka.yaml"
    cfg.write_text(yaml.safe_dump(danka_config(args, model_path, data, out_dir)))
    from bench.lib.danka_side import danka_train_command

    cmd = danka_train_command(cfg, args.danka_set, args.eager_head)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env())
    if proc.returncode != 0:
        raise RuntimeError("danka train failed:\n" + proc.stderr[-3000:])
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r]
    peaks = [r["memory/peak_gib"] for r in rows if "memory/peak_gib" in r]
    lens = [r["response_length"] for r in rows if "response_length" in r]
    import danka

    # where the step's time and memory go: each phase's seconds and peak GiB, per step
    phases = {
        k: [r[k] for r in rows if k in r]
        for k in sorted({k for r in rows for k in r})
        if k.startswith("time/") or (k.startswith("memory/") and k.endswith("_peak_gib"))
    }
    return {
        "step_s": [r["time/step"] for r in rows],
        "rollout_s": [r["time/rollout"] for r in rows if "time/rollout" in r],
        "completion_len": lens,
        "peak_gib": max(peaks) if peaks else None,
        "phases": phases,
        "overrides": args.danka_set,
        "fused_head": not args.eager_head,
        "danka_file": danka.__file__,
    }


def summarise(res: dict, args) -> dict:
    """Medians over the steps after the first (a warm-up): step seconds, rollout seconds,
    completion tokens per step second and per rollout second (generated tok/s)."""
    steps = res["step_s"][1:] or res["step_s"]  # the first step warms up
    res["median_step_s"] = statistics.median(steps) if steps else None
    rollout = res.get("rollout_s", [])[1:] or res.get("rollout_s", [])
    res["median_rollout_s"] = statistics.median(rollout) if rollout else None
    if res.get("completion_len"):
        res["mean_completion_len"] = statistics.mean(res["completion_len"])
        toks = args.prompts * args.generations * res["mean_completion_len"]
        if res["median_step_s"]:
            res["completion_tok_per_step_s"] = toks / res["median_step_s"]
        if res["median_rollout_s"]:
            res["generated_tok_s"] = toks / res["median_rollout_s"]
    return res


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = parser("trl", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model path or hub id (both sides load it)")
    src.add_argument("--tiny", action="store_true", help="tiny random model (CPU smoke test)")
    ap.add_argument("--random-weights", action="store_true", help="--model's shape, random weights")
    ap.add_argument("--variants", default="lora,full", help="lora,full or one of them")
    ap.add_argument("--sides", default="trl,danka", help="trl,danka[,danka-eager] or a subset")
    ap.add_argument("--side", choices=["trl", "danka"], help="(internal) run one side")
    ap.add_argument("--variant", default="lora", choices=["lora", "full"], help="(with --side)")
    ap.add_argument("--eager-head", action="store_true", help="(with --side danka) eager head")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro", type=int, default=16, help="sequences per forward/backward")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps (first = warm-up)")
    ap.add_argument("--task", default="sum", choices=["sum", "gsm8k"],
                    help="sum: a + b prompts (the TRL anchor); gsm8k: examples/gsm8k_grpo.yaml's "
                    "prompts, reward and settings (see settings())")  # fmt: skip
    ap.add_argument("--gsm8k-data", default="data/gsm8k/train.jsonl", help="--task gsm8k rows")
    ap.add_argument("--gc", default="auto", choices=["auto", "on", "off"],
                    help="gradient checkpointing on both sides (auto: the task's)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--danka-set", action="append", default=[], metavar="KEY=VALUE",
        help="danka side: override a config key (YAML value), e.g. rollout.lora_compute=adapter",
    )  # fmt: skip
    ap.add_argument("--out", help="(with --side) the side's JSON")
    add_output_args(ap, timeout=300)
    args = ap.parse_args(argv)
    if (args.prompts * args.generations) % args.micro:
        ap.error("--micro must divide prompts x generations")
    return args


def save_random_copy(model: str, out: Path) -> Path:
    """``model``'s config, tokenizer and chat template with random bf16 weights, in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    from danka.models.loading import load_causal_lm, load_tokenizer

    quiet = lambda *_: None  # noqa: E731
    config = load_causal_lm(model, dtype="bfloat16", device="cpu", log=quiet).config
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(str(out))
    load_tokenizer(model, log=quiet).save_pretrained(str(out))
    return out


def one_side(args) -> None:
    """This process runs ``args.side`` for ``args.variant`` and writes its JSON."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_path = args.model
        if args.tiny:
            from danka.models.tiny import save_tiny_model

            model_path = str(save_tiny_model(work / "tiny"))
        elif args.random_weights:
            model_path = str(save_random_copy(args.model, work / "random"))
        t0 = time.perf_counter()
        side = side_trl if args.side == "trl" else side_danka
        res = summarise(side(args, model_path, work), args)
    res.update(side=args.side, variant=args.variant, wall_s=time.perf_counter() - t0)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k not in ("step_s", "completion_len")}))


def compare(args) -> dict:
    """Per variant, each side in a fresh process; the step-time and peak ratios."""
    common = ["--prompts", str(args.prompts), "--generations", str(args.generations)]
    common += ["--new-tokens", str(args.new_tokens), "--micro", str(args.micro)]
    common += ["--steps", str(args.steps), "--seed", str(args.seed)]
    common += ["--task", args.task, "--gsm8k-data", args.gsm8k_data, "--gc", args.gc]
    model = args.model
    if model and model.endswith(".gguf"):  # TRL cannot read GGUF: both sides get its HF folder
        from danka.models.gguf import ensure_converted

        model = str(ensure_converted(model))
    common += ["--tiny"] if args.tiny else ["--model", model]
    common += ["--random-weights"] if args.random_weights else []
    common += [f"--danka-set={o}" for o in args.danka_set]
    res: dict = {
        "bench": "trl",
        "model": "tiny" if args.tiny else args.model,
        "model_folder": None if args.tiny else model,
        "random_weights": args.random_weights,
        "task": args.task,
        "batch": {
            "prompts": args.prompts,
            "generations": args.generations,
            "new_tokens": args.new_tokens,
            "micro": args.micro,
            "steps": args.steps,
        },
        "settings": f"GRPO ({args.task}), {args.prompts} prompts x {args.generations} "
        f"generations, {args.new_tokens} max new tokens, micro-batch {args.micro}, bf16 on a "
        "GPU, temperature 1, one optimizer step per rollout; learning rates, beta, LoRA "
        "rank and checkpointing per task (each side's 'settings'); median step s after the "
        "first step; rollout s: TRL's generate calls / danka's time/rollout; peak = "
        "torch.cuda.max_memory_allocated",
        "variants": {},
    }
    with sides_folder(args.out_dir) as tmp:
        for variant in args.variants.split(","):
            sides = {}
            for side in args.sides.split(","):
                cmd = ["--side", side.split("-")[0], "--variant", variant]
                cmd += ["--eager-head"] if side == "danka-eager" else []
                path = tmp / f"trl_{variant}_{side}.json"
                sides[side] = run_side(bench_command("trl", *cmd, *common), path, args.timeout)
                print(variant, side, {k: v for k, v in sides[side].items() if k != "step_s"})
                res["variants"][variant] = {"sides": sides}  # a run cut short keeps what it has
                write_result({**res, "partial": True}, args.out_dir, result_name(args))
            entry: dict = {"sides": sides}
            t, d = (sides.get(s, {}).get("median_step_s") for s in ("trl", "danka"))
            if t and d:
                entry["trl_over_danka_step_time"] = t / d
            gt, gd = (sides.get(s, {}).get("generated_tok_s") for s in ("trl", "danka"))
            if gt and gd:
                entry["danka_over_trl_generated_tok_s"] = gd / gt
            pt, pd = (sides.get(s, {}).get("peak_gib") for s in ("trl", "danka"))
            if pt and pd:
                entry["danka_over_trl_peak"] = pd / pt
            e = sides.get("danka-eager", {}).get("median_step_s")
            if t and e:
                entry["trl_over_danka_eager_head_step_time"] = t / e
            res["variants"][variant] = entry
    return res


def result_name(args) -> str:
    model = "tiny" if args.tiny else Path(args.model).stem
    return args.name or f"trl_{model}_{args.prompts}x{args.generations}"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return sides_main(args, one_side, compare, result_name(args))
