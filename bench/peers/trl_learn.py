"""GSM8K for N minutes with TRL's ``GRPOTrainer``: the peer's learning curve beside danka's.

    python -m bench trl-learn --model qwen2.5-coder-0.5b-instruct.gguf \\
        --out bench/results/gsm8k_qwen05_trl.json --beside bench/results/gsm8k_qwen05_grpo.json
    python -m bench trl-learn --tiny --train T.jsonl --test E.jsonl --minutes 0.1 \\
        --save-minutes 0.05 --prompts 2 --micro 4 --new-tokens 8 --eval-tokens 8 \\
        --out /tmp/t.json                                   # CPU check of the bench

The job of ``python -m bench gsm8k examples/gsm8k_grpo.yaml``, read through danka's own
config loading of that example: the model (a ``.gguf`` is converted once by danka's
``ensure_converted``: TRL cannot read GGUF; bf16 weights on a GPU, as danka loads them),
the training and test rows, the prompts (the user turn danka's ``build_messages`` makes
with the example's instruction; TRL renders it with the chat template and generation
prompt, as danka's ``render_prompt`` does), the reward trained on (danka's ``gsm8k``
strict rule, format score 0), 64 prompts x 8 answers and one optimizer step a rollout,
<= 512 new tokens, temperature 1, a constant learning rate, answers that stop where
danka's stop (eos and the end-of-turn tokens); and the evaluation: danka's own (``danka
eval``'s ``load_for_inference`` + ``evaluate_rows``), greedy, the example's four labelled
rewards and 512 new tokens, the first (base) and the last on every test row, those between
on the first ``--eval-subset`` (``eval.subset_size``).

TRL's own: its documented GRPO + LoRA recipe for a 0.5B model (``RECIPE``), TRL's defaults
where the recipe sets nothing (beta 0, its loss and reward scaling, gradient checkpointing,
bf16), TRL's HF ``generate`` rollout. ``trl_settings`` in the JSON holds every value.

A callback saves the adapter every ``--save-minutes`` of training and stops it at
``--minutes``; minutes count from this command's start, as danka's ``eval/minutes`` count
from ``danka train``'s. TRL's evaluations run after training, so they are not in its
minutes, while danka's are in its own (``eval_note``). The JSON has ``bench gsm8k``'s keys:
``before``, ``after``, ``curve`` (``step``, ``minute``, ``n``, each metric), ``milestones``,
``wall_minutes`` (here: to the end of training); a PNG beside it when matplotlib is there.
``--eval-only`` evaluates what an earlier run left in ``--work``. TRL is not a danka
dependency: install it on the benchmark machine only (``.whl_trl/``).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.common import ROOT, environment, parser
from bench.lib.gsm8k_data import GSM8K_EXAMPLE, METRICS, data_path, example, milestones, minutes_to
from bench.peers.trl_settings import gsm8k_strict_reward

# TRL's GRPO + LoRA recipe for Qwen2-0.5B: https://huggingface.co/docs/trl/peft_integration
# ("PEFT with Different Trainers" > GRPO > "With LoRA", and its learning-rate table: GRPO
# with LoRA 1e-5, ten times the full-parameter 1e-6). It names no target modules (PEFT's
# default for the model type: q_proj, v_proj on Qwen2), beta, scheduler or a batch that
# runs (per-device 2 cannot hold a group of 8): the batch is the example's.
RECIPE_URL = "https://huggingface.co/docs/trl/peft_integration"
RECIPE = {"lora_r": 32, "lora_alpha": 16, "lora_dropout": 0.05, "lr": 1e-5}
# the command-line knobs trl_settings records as given
KNOBS = "lr lora_r lora_alpha lora_dropout beta prompts generations micro new_tokens seed".split()
EVAL_NOTE = (
    "TRL's evaluations ran after training, on the adapters saved at each minute, and are "
    "not in its minutes; danka's run inside `danka train` and are in its minutes"
)
INSTALL = (
    "trl-learn needs TRL 1.16 and datasets (not danka dependencies): pip install "
    "trl==1.16.0 datasets, or on the GPU machine the wheels in .whl_trl/ (bench/gpu/speed.sh)"
)


def due(elapsed: float, next_save: float, every: float, limit: float) -> tuple[bool, bool, float]:
    """(save now, stop now, the next save's minute) after a step that ended ``elapsed``
    minutes into training: a save at each multiple of ``every`` passed (one, however many
    a slow step passed) and at ``limit``, where training stops."""
    stop = elapsed >= limit
    if not stop and elapsed < next_save:
        return False, False, next_save
    return True, stop, (math.floor(elapsed / every) + 1) * every


@dataclass
class MinuteSaver:
    """The clock of a TRL run: saves the adapter into ``folder`` every ``every`` minutes of
    training and says stop at ``limit``; each save's ``minute`` counts from ``started``
    (this command's start, seconds on ``clock``). No TRL here: the callback calls it."""

    folder: Path
    every: float
    limit: float
    started: float
    clock: Callable[[], float] = time.monotonic
    saves: list[dict] = field(default_factory=list)
    log: list[dict] = field(default_factory=list)  # TRL's per-step reward and length
    train_started: float = 0.0  # minutes, like each save's
    ended: float = 0.0
    _t0: float = 0.0
    _next: float = 0.0

    def minute(self) -> float:
        return round((self.clock() - self.started) / 60, 3)

    def begin(self) -> None:
        self._t0, self._next, self.train_started = self.clock(), self.every, self.minute()

    def step_end(self, step: int, model: Any) -> bool:
        """Save when due; True when training should stop."""
        elapsed = (self.clock() - self._t0) / 60
        save, stop, self._next = due(elapsed, self._next, self.every, self.limit)
        if save:
            self.save(step, model)
        return stop

    def end(self, step: int, model: Any) -> None:
        """Training ended: the last step's adapter is saved (once), the minute kept."""
        if not self.saves or self.saves[-1]["step"] != step:
            self.save(step, model)
        self.ended = self.minute()

    def save(self, step: int, model: Any) -> None:
        minute = self.minute()
        path = self.folder / f"minute_{minute:06.2f}_step_{step}"
        model.save_pretrained(str(path))
        self.saves.append({"minute": minute, "step": step, "adapter": str(path)})

    def note(self, step: int, logs: dict) -> None:
        """TRL's log line of a step: its mean reward and answer length, kept."""
        if "reward" in logs:
            length = logs.get("completions/mean_length")
            self.log.append(
                {"step": step, "minute": self.minute(), "reward": logs["reward"], "length": length}
            )

    def record(self) -> dict:
        return {
            "train_started": self.train_started,
            "wall_minutes": self.ended,
            "saves": self.saves,
            "train_log": self.log,
        }


def saver_callback(saver: MinuteSaver) -> Any:
    """A ``TrainerCallback`` that hands TRL's events to ``saver``."""
    from transformers import TrainerCallback

    class SaveByMinutes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            saver.begin()

        def on_step_end(self, args, state, control, model=None, **kw):
            if saver.step_end(state.global_step, model):
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            saver.note(state.global_step, logs or {})

        def on_train_end(self, args, state, control, model=None, **kw):
            saver.end(state.global_step, model)

    return SaveByMinutes()


@dataclass(frozen=True)
class Job:
    """What both sides share, read from examples/gsm8k_grpo.yaml by danka's config loader."""

    train: list  # PromptRow: question, ground truth
    test: list
    specs: list  # RewardSpec: strict (trained on), flexible, boxed, format (labels)
    data: Any  # the data section: system prompt, instruction, examples (the user turn)
    timeout_s: float


def load_job(train: str, test: str, work: Path) -> Job:
    from danka.config import load_config
    from danka.data.splits import load_rows
    from danka.rewards.combine import reward_specs

    paths = [
        f"data.{key}_dataset={data_path(path).resolve()}"
        for key, path in (("train", train), ("eval", test))
    ]
    cfg, base_dir = load_config(str(GSM8K_EXAMPLE), paths)
    rows, held = load_rows(cfg, base_dir, work)
    return Job(rows, held, reward_specs(cfg, held), cfg.data, cfg.reward.timeout_s)


def trl_rows(job: Job) -> list[dict]:
    """TRL's rows: the user turn danka builds (``build_messages``) and the ground truth."""
    from danka.data.template import build_messages

    d = job.data
    style = {"system_prompt": d.system_prompt, "instruction": d.instruction, "examples": d.examples}
    return [
        {"prompt": build_messages(r.prompt, **style), "answer": r.ground_truth} for r in job.train
    ]


def trl_configs(args, cuda: bool) -> tuple[Any, Any]:
    """TRL's ``GRPOConfig`` and PEFT's ``LoraConfig`` from the command line (``RECIPE``)."""
    from peft import LoraConfig
    from trl import GRPOConfig

    config = GRPOConfig(
        output_dir=str(args.work / "trl"),
        per_device_train_batch_size=args.micro,
        # one optimizer step a rollout of prompts x generations answers, as danka's example
        gradient_accumulation_steps=args.prompts * args.generations // args.micro,
        num_generations=args.generations,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=args.beta,
        max_steps=1_000_000,  # the clock stops it
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
    )
    targets = args.target_modules
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules=targets if targets in (None, "all-linear") else targets.split(","),
    )
    return config, lora


def train(args, model_path: str, job: Job, saver: MinuteSaver) -> dict:
    """TRL's GRPO with LoRA on ``job.train`` until ``saver`` stops it: the saves, TRL's
    per-step log and every setting (``trl_settings``)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from danka.models.loading import load_tokenizer, resolve_dtype, stop_ids
    from danka.models.special_tokens import sync_special_tokens

    cuda = torch.cuda.is_available()
    tokenizer = load_tokenizer(model_path, log=lambda *_: None)
    # the weights' dtype danka's "auto" gives (bf16 on a GPU), as the Hub's checkpoint has
    # it: a folder converted from GGUF says float32
    dtype = resolve_dtype("auto", "cuda" if cuda else "cpu")
    net = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    sync_special_tokens(net, tokenizer)
    net.generation_config.eos_token_id = stop_ids(tokenizer)  # where danka's answers stop
    config, lora = trl_configs(args, cuda)
    trainer = GRPOTrainer(
        model=net,
        reward_funcs=gsm8k_strict_reward,
        args=config,
        train_dataset=Dataset.from_list(trl_rows(job)),
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[saver_callback(saver)],
    )
    trainer.train()
    given = ("loss_type", "scale_rewards", "bf16", "gradient_checkpointing")
    settings = {
        "recipe": RECIPE_URL,
        **{k: getattr(args, k) for k in KNOBS},
        "target_modules": sorted(trainer.model.peft_config["default"].target_modules),
        "lr_scheduler": "constant (danka's; the recipe names none)",
        "beta_source": "TRL's default" if args.beta == 0.0 else "--beta",
        "optimizer_steps_per_rollout": 1,
        "temperature": 1.0,
        "dtype": str(net.dtype),
        "eos_token_ids": stop_ids(tokenizer),
        **{k: getattr(config, k) for k in given},  # TRL's defaults
    }
    del trainer, net
    gc.collect()
    torch.cuda.empty_cache()  # the evaluations load the model again
    return {**saver.record(), "trl_settings": settings}


def evaluate(model_path: str, adapter: str | None, rows: list, job: Job, args) -> dict:
    """danka's evaluation of the base model or one adapter, ``danka eval``'s code path:
    ``load_for_inference`` then ``evaluate_rows``, greedy, the example's labelled rewards."""
    from danka.rewards.combine import build_reward_computer
    from danka.tools.evaluate import evaluate_rows
    from danka.tools.generate import load_for_inference

    rewards = build_reward_computer(
        job.specs, base_dir=ROOT, timeout_s=job.timeout_s, on_error="fail"
    )
    try:
        net, tokenizer = load_for_inference(model_path, adapter, log=lambda *_: None)
        t0 = time.perf_counter()
        res = evaluate_rows(
            net,
            tokenizer,
            rows,
            rewards,
            max_new_tokens=args.eval_tokens,
            batch_size=args.eval_batch,
            system=job.data.system_prompt,
            instruction=job.data.instruction,
            examples=job.data.examples,
        )
        return {**res, "seconds": round(time.perf_counter() - t0, 2)}
    finally:
        rewards.close()


def point(res: dict, step: int, minute: float) -> dict:
    """One evaluation with the keys of ``bench gsm8k``'s curve."""
    per = res["correct_per_function"]
    return {
        "step": step,
        "minute": minute,
        "n": res["n"],
        **{m: per.get(m) for m in METRICS},
        "mean_length": res["response_length"],
        "truncated": res["truncation_rate"],
        "seconds": res["seconds"],
    }


def summarize(curve: list[dict], run: dict) -> dict:
    """The result's numbers from the curve (base first) and the training run's record."""
    before, after = curve[0], curve[-1]
    return {
        "n": before["n"],
        "before": before,
        "after": after,
        "curve": curve,
        "minutes_to": minutes_to(curve),
        "milestones": milestones(curve),
        "wall_minutes": run["wall_minutes"],
        "steps": after["step"],
        "eval_note": EVAL_NOTE,
        "eval_seconds": round(sum(p["seconds"] for p in curve), 1),
        "trl_settings": run["trl_settings"],
        "train_log": run["train_log"],
    }


def evaluate_run(args, model_path: str, job: Job, run: dict, write: Callable) -> list[dict]:
    """The base (at the minute training started) then each saved adapter; ``write`` gets
    the curve so far after each."""
    todo = [(None, 0, run["train_started"])]
    todo += [(s["adapter"], s["step"], s["minute"]) for s in run["saves"]]
    curve: list[dict] = []
    for i, (adapter, step, minute) in enumerate(todo):
        full = i in (0, len(todo) - 1) or not args.eval_subset
        rows = job.test if full else job.test[: args.eval_subset]
        curve.append(point(evaluate(model_path, adapter, rows, job, args), step, minute))
        print(f"[trl-learn] step {step} (minute {minute}): {curve[-1]}", flush=True)
        write(curve)
    return curve


def plot(result: dict, path: Path, beside: dict | None) -> None:
    """Strict and flexible accuracy against minutes: TRL's, and danka's when given."""
    if importlib.util.find_spec("matplotlib") is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for who, res, color in (("TRL", result, "C1"), ("danka", beside, "C0")):
        curve = [p for p in (res or {}).get("curve", []) if p["minute"] is not None]
        for metric, style in (("strict", "o-"), ("flexible", "s--")):
            ys = [100 * (p[metric] or 0.0) for p in curve]
            ax.plot([p["minute"] for p in curve], ys, style, color=color, label=f"{who} {metric}")
    ax.set_xlabel("minutes since the command started (TRL: evaluations not included)")
    ax.set_ylabel("GSM8K test accuracy, greedy (%)")
    ax.set_title(f"GSM8K, {result['model']['file']}: TRL GRPOTrainer + LoRA")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def header(args, argv: list[str]) -> dict:
    """Command, date, device, versions and the model, as ``bench gsm8k``'s result opens."""
    import peft
    import torch
    import transformers
    import trl

    model = Path(args.model or "tiny")
    return {
        "bench": "trl-learn",
        "command": " ".join(["python -m bench trl-learn", *argv]),
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.node(),
        "versions": {m.__name__: m.__version__ for m in (torch, transformers, peft, trl)}
        | {"python": platform.python_version()},
        "model": {"file": model.name, "bytes": None if args.tiny else _size(model)},
        "environment": environment(),  # the commit, CUDA and the GPU, as every bench result
    }


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*"))


def model_folder(args) -> str:
    """An HF folder TRL can load: the tiny model, a converted ``.gguf``, or ``--model``."""
    if args.tiny:
        from danka.models.tiny import save_tiny_model

        return str(save_tiny_model(args.work / "tiny"))
    if args.model.endswith(".gguf"):
        from danka.models.gguf import ensure_converted

        return str(ensure_converted(args.model))
    return args.model


def parse(argv: list[str]) -> argparse.Namespace:
    t = example()["trainer"]
    ap = parser("trl-learn", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a .gguf file or an HF model folder")
    src.add_argument("--tiny", action="store_true", help="tiny random model (CPU smoke test)")
    ap.add_argument("--train", default="data/gsm8k/train.jsonl")
    ap.add_argument("--test", default="data/gsm8k/test.jsonl")
    ap.add_argument("--minutes", type=float, default=20.0, help="training wall minutes")
    ap.add_argument("--save-minutes", type=float, default=2.0, help="an adapter every N min")
    ap.add_argument("--eval-subset", type=int, default=500, help="middle evaluations' rows")
    ap.add_argument("--eval-tokens", type=int, default=512, help="eval max new tokens")
    ap.add_argument("--eval-batch", type=int, default=256, help="eval sequences per generate")
    ap.add_argument("--out", required=True, type=Path, help="the result JSON (PNG beside)")
    ap.add_argument("--work", type=Path, default=ROOT / "output" / "trl_learn")
    ap.add_argument("--beside", type=Path, help="a `bench gsm8k` result to draw in the PNG")
    ap.add_argument("--eval-only", action="store_true", help="evaluate --work's earlier run")
    ap.add_argument("--lr", type=float, default=RECIPE["lr"])
    ap.add_argument("--lora-r", type=int, default=RECIPE["lora_r"])
    ap.add_argument("--lora-alpha", type=int, default=RECIPE["lora_alpha"])
    ap.add_argument("--lora-dropout", type=float, default=RECIPE["lora_dropout"])
    ap.add_argument("--target-modules", help="all-linear or q_proj,v_proj,... (PEFT's default)")
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (TRL's default)")
    ap.add_argument("--prompts", type=int, default=t["batch_size"], help="prompts a step")
    ap.add_argument("--generations", type=int, default=t["samples_per_prompt"])
    ap.add_argument("--new-tokens", type=int, default=t["max_new_tokens"])
    ap.add_argument("--micro", type=int, default=16, help="sequences per forward/backward")
    ap.add_argument("--seed", type=int, default=42, help="TRL's default (and danka's)")
    args = ap.parse_args(argv)
    above_zero = ("minutes", "save_minutes", "eval_tokens", "eval_batch", "lr", "lora_r")
    above_zero += ("lora_alpha", "prompts", "generations", "new_tokens", "micro")
    at_least_zero = ("eval_subset", "beta", "lora_dropout")
    for name in above_zero + at_least_zero:
        value, zero_ok = getattr(args, name), name in at_least_zero
        if value < 0 or (value == 0 and not zero_ok):
            bound = "0 or more" if zero_ok else "above 0"
            ap.error(f"--{name.replace('_', '-')} must be {bound} (got {value})")
    if (args.prompts * args.generations) % args.micro:
        ap.error("--micro must divide prompts x generations")
    return args


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # the clock's origin: this command's start
    argv = list(argv or [])
    args = parse(argv)
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        raise SystemExit(INSTALL)
    args.work.mkdir(parents=True, exist_ok=True)
    model_path = model_folder(args)
    job = load_job(args.train, args.test, args.work)
    run_file = args.work / "run.json"
    if args.eval_only:
        run = json.loads(run_file.read_text())
    else:
        run = train(
            args,
            model_path,
            job,
            MinuteSaver(args.work / "adapters", args.save_minutes, args.minutes, started),
        )
        run_file.write_text(json.dumps(run, indent=2))
    head = header(args, argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(curve: list[dict], partial: bool = True) -> dict:
        result = {**head, **summarize(curve, run), **({"partial": True} if partial else {})}
        args.out.write_text(json.dumps(result, indent=2))
        return result

    result = write(evaluate_run(args, model_path, job, run, write), partial=False)
    beside = json.loads(args.beside.read_text()) if args.beside else None
    plot(result, args.out.with_suffix(".png"), beside)
    b, a = result["before"], result["after"]
    print(
        f"TRL: strict {100 * b['strict']:.1f}% -> {100 * a['strict']:.1f}%, flexible "
        f"{100 * b['flexible']:.1f}% -> {100 * a['flexible']:.1f}%, {a['step']} steps in "
        f"{result['wall_minutes']} min; wrote {args.out}",
        flush=True,
    )
    return 0
