"""Training-side benchmarks of danka on one GPU: step time, update MFU, memory.

Run on the GPU machine from the repository root (all sections, ~3-5 minutes on an H200)::

    python bench/bench_train.py --data gsm8k_train.jsonl --out bench_train.json

Sections (``--only a,b``), each failing on its own (the error goes to the JSON and table):

1. ``grpo_step``: danka's GRPO ``train_step`` at TRL's anchor settings (SmolLM2-135M-Instruct,
   8 prompts x 8 samples, 256 new tokens, LoRA r16 all-linear or full-parameter, gradient
   checkpointing, beta 0): median step time (first step excluded), per-phase times and peak
   memory, vs TRL 1.16 GRPOTrainer on the same machine.
2. ``update_05b``: danka's update path (``danka.trainer.update.update``: chunked log-probs,
   policy loss, backward, fused AdamW) on a random Qwen2.5-0.5B, 16 x 512 tokens:
   tokens/s, MFU = 6 * N * tokens / time / 790e12 (N = every parameter, the tied
   embedding/lm_head once: its matmul is the lm_head), peak memory.
3. ``ppo_7b``: the whole PPO ``train_step`` (actor LoRA, critic LoRA + value head, reference =
   adapters off, one random Qwen2-7B-shaped base) with 4 prompts x 512 tokens + exactly 128
   new tokens: peak memory per phase, for each rollout engine.
4. ``logprob_memory``: chunked log-probs + entropy vs a naive full-logits log-softmax, LM head
   only, 16 x 512 tokens of the 0.5B shape, forward + backward: peak memory, time, agreement.
5. ``packing``: danka's effective-token ratio (length-grouped, trimmed micro-batches of 8) vs
   padding the whole batch to its longest prompt and response.
6. ``packing_step``: the GRPO update with ``data.packing`` on vs off on GSM8K-like lengths,
   SmolLM2-135M and 0.5B shapes: step s, peak (bench/packing_step.py).

``ppo_7b`` engines: ``hf``, ``fast`` and ``hf-qlora`` (an NF4 base through
``model.load_in_4bit``, bench/ppo_memory.py); every engine also records ``danka estimate``'s
prediction for its settings and the relative error. ``--profile`` adds the top CUDA kernels
of a few ``update_05b`` steps to each variant (bench/kernel_profile.py).

``--tiny --device cpu`` swaps every model for a small one (danka.models.tiny) and every size
for a small one, so each code path runs on a laptop; timings then mean nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import statistics
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the bench's own modules

from kernel_profile import profile_or_error

import danka.models.logprobs as lpm
from danka.algorithms.kl import FixedKLController
from danka.config import load_config
from danka.lifecycle import compile_forward
from danka.models import tiny
from danka.models.loading import configure_attention_backends
from danka.models.logprobs import chunked_logprobs_entropy
from danka.models.lora import count_parameters
from danka.rewards.combine import RewardOutput
from danka.rollout.base import build_engine
from danka.trainer import fit
from danka.trainer.forward import effective_token_ratio
from danka.trainer.models import build_models
from danka.trainer.optim import build_optimizer, build_scheduler
from danka.trainer.run import PromptSet, Run, RunState
from danka.trainer.sampler import PromptSampler
from danka.trainer.setup import build_algorithm, build_run
from danka.trainer.update import update
from danka.types import PromptRow, RolloutBatch

PEAK_FLOPS = 790e12  # measured dense bf16 matmul ceiling of the H200 (not the 989 TF sheet)
GIB = 2**30
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
# TRL 1.16 GRPOTrainer, same machine and settings: (median step s, peak GiB)
TRL_ANCHOR = {"lora": (15.7, 4.20), "full": (16.8, 5.09)}
HF_UPDATE_ANCHOR = {"tok_s": 77e3, "mfu": 0.29, "peak_gib": 27.3}
# (real, --tiny) sizes per section; b = sequences, p = prompt tokens, r = response tokens
SIZES = {
    "grpo_step": ({"prompts": 8, "n": 8, "new": 256, "sentences": 8},
                  {"prompts": 2, "n": 4, "new": 16, "sentences": 2}),
    "update_05b": ({"b": 16, "p": 128, "r": 384, "iters": 5}, {"b": 4, "p": 16, "r": 48, "iters": 2}),
    "ppo_7b": ({"b": 4, "p": 512, "new": 128}, {"b": 2, "p": 32, "new": 16}),
    "logprob_memory": ({"n": 16 * 512, "h": 896, "vocab": 151936, "chunk": 1024, "iters": 3},
                       {"n": 4 * 64, "h": 64, "vocab": 4096, "chunk": 64, "iters": 2}),
}  # fmt: skip


def sizes(args, section: str) -> SimpleNamespace:
    return SimpleNamespace(**SIZES[section][1 if args.tiny else 0])


def shape(args, real: Callable):
    """(model config, dtype): the real shape in bf16, or a tiny Qwen2 in fp32 with --tiny."""
    if args.tiny:
        return tiny.tiny_config(tiny.tiny_tokenizer(), arch="qwen2"), torch.float32
    return real(), torch.bfloat16


# ----------------------------------------------------------------------------- helpers


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gib(dev: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(dev) / GIB if dev.type == "cuda" else None


def free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def timed(fn: Callable[[], object], dev: torch.device) -> float:
    sync(dev)
    t0 = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t0


def quiet_log(verbose: bool) -> logging.Logger:
    log = logging.getLogger("bench_train")
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    if not log.handlers:
        log.addHandler(logging.StreamHandler(sys.stderr))
    return log


def random_model(config, dev: torch.device, dtype: torch.dtype):
    """Random-weight causal LM built directly on ``dev`` in ``dtype`` (no CPU copy, no fp32
    detour: a 7B model is 15 GB). HF's init (normal_, std 0.02) runs on the device in
    seconds; skipping it would leave uninitialised memory (possible NaNs). Put in eval mode,
    the state ``danka.models.loading.load_causal_lm`` (from_pretrained) hands to build_models,
    so the bench sees what a real run sees (see ``--train-mode``)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def gc_active(model: torch.nn.Module) -> bool:
    """HF layers checkpoint only when ``gradient_checkpointing`` is set AND in train mode."""
    return any(getattr(m, "gradient_checkpointing", False) and m.training for m in model.modules())


class _NoText:
    """Tokenizer stand-in for random-weight runs: completions decode to empty strings."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def random_rewards(rows, prompts, completions, **_) -> RewardOutput:
    """Reward stand-in for random-weight runs: N(0, 1) scores, so advantages are non-zero."""
    b = len(completions)
    return RewardOutput(scores=torch.randn(b), per_function={}, valid=torch.ones(b, dtype=torch.bool),
                        num_errors=0, num_calls=b)  # fmt: skip


def bare_run(cfg, models, dev, dtype, log, *, prompts=None, engine=None, eos=(), pad=0) -> Run:
    """A ``Run`` without tokenizer, data files or reward functions: the pieces
    ``danka.trainer.setup.build_run`` would load are replaced by stand-ins, so random-weight
    models (no files) go through the trainer's own ``train_step``/``update``."""
    t = cfg.trainer
    sched = dict(kind="constant", warmup_steps=0, total_steps=10_000)
    actor_opt = build_optimizer(models.actor_params, lr=t.lr, weight_decay=t.weight_decay)
    critic_opt = critic_sched = None
    if models.critic_params:
        critic_opt = build_optimizer(models.critic_params, lr=t.critic_lr, weight_decay=0.0)
        critic_sched = build_scheduler(critic_opt, **sched)
    prompts = prompts or []
    rows = [PromptRow(index=i, prompt="") for i in range(len(prompts))]
    sampler = PromptSampler(len(prompts), t.batch_size, seed=0, shuffle=False) if prompts else None
    return Run(
        cfg=cfg, base_dir=Path.cwd(), output_dir=Path(tempfile.gettempdir()), device=dev,
        dtype=dtype, tokenizer=_NoText(), models=models, engine=engine, rewards=random_rewards,
        train=PromptSet(rows=rows, texts=[""] * len(rows), ids=prompts), eval=None,
        actor_opt=actor_opt, actor_sched=build_scheduler(actor_opt, **sched),
        critic_opt=critic_opt, critic_sched=critic_sched, kl_ctl=FixedKLController(t.kl.coef),
        sampler=sampler, log=log, algo=build_algorithm(cfg),
        state=RunState(total_steps=10_000, micro_batch_size=t.micro_batch_size),
        update_generator=torch.Generator().manual_seed(0), eos_ids=list(eos), pad_id=pad,
    )  # fmt: skip


def run_steps(run: Run, steps: int, dev: torch.device) -> dict:
    """``steps`` calls of ``fit.train_step``; median over steps 2.. and per-phase peaks,
    as the loop itself measures them (``time/<phase>``, ``memory/<phase>_peak_gib``)."""
    per_step, peaks = [], defaultdict(float)
    reset_peak(dev)
    for step in range(1, steps + 1):
        metrics, batch, _ = fit.train_step(run, step)
        keep = {k: float(v) for k, v in metrics.items()
                if k.startswith(("time/", "throughput/", "packing/", "response"))}  # fmt: skip
        keep["prompt_tokens_mean"] = float(batch.prompt_mask.sum(1).float().mean())
        per_step.append(keep)
        for k, v in metrics.items():
            if k.startswith("memory/") and k.endswith("_peak_gib"):
                name = k.removeprefix("memory/").removesuffix("_peak_gib")
                peaks[name] = max(peaks[name], float(v))
        if "memory/peak_gib" in metrics:
            peaks["step"] = max(peaks["step"], float(metrics["memory/peak_gib"]))
    later = per_step[1:] or per_step
    med = {k: statistics.median(s[k] for s in later) for k in later[0]}
    return {"steps": per_step, "median": med, "first_step_s": per_step[0]["time/step"],
            "median_step_s": med["time/step"],
            "phase_peak_gib": dict(peaks) if dev.type == "cuda" else None}  # fmt: skip


# ------------------------------------------------------------------------- sections


def synthetic_gsm8k(path: Path, rows: int, sentences: int) -> Path:
    """GSM8K-format rows (question/answer '#### n'); ``sentences`` x ~16 tokens per question."""
    g = torch.Generator().manual_seed(0)
    names = ["Tom", "Maria", "Ali", "Chen", "Priya", "Lena", "Omar", "Kofi"]
    with path.open("w") as f:
        for i in range(rows):
            parts = []
            for s in range(sentences):
                a, b, c = torch.randint(2, 99, (3,), generator=g).tolist()
                parts.append(f"{names[(i + s) % 8]} buys {a} boxes of {b} pencils each and then "
                             f"gives {c} pencils to a friend at school.")  # fmt: skip
            q = " ".join(parts) + " How many pencils are left in total?"
            f.write(json.dumps({"question": q, "answer": f"Work it out. #### {i}"}) + "\n")
    return path


def sec_grpo_step(args, dev: torch.device, log) -> dict:
    z = sizes(args, "grpo_step")
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
                out["variants"][key] = _grpo_one(args, dev, log, overrides, variant)
            except Exception as err:  # noqa: BLE001 - one variant failing keeps the others
                out["variants"][key] = {"error": _err(err)}
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


def _grpo_one(args, dev, log, overrides: list[str], variant: str) -> dict:
    cfg, base_dir = load_config(None, overrides)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = build_run(cfg, base_dir, out_dir, log)
    try:
        if args.train_mode:
            run.models.policy.train()
        res = run_steps(run, args.steps, dev)
        res["gc_active"] = gc_active(run.models.policy)
        trainable, total = count_parameters(run.models.policy)
        res["params"], res["trainable_params"] = total, trainable
    finally:
        getattr(run.engine, "release", lambda: None)()
        getattr(run.rewards, "close", lambda: None)()
    anchor_s, anchor_gib = TRL_ANCHOR[variant]
    res["trl_step_s"], res["trl_peak_gib"] = anchor_s, anchor_gib
    res["speedup_vs_trl"] = anchor_s / res["median_step_s"]
    peaks = res["phase_peak_gib"]
    res["peak_gib"] = peaks.get("step") if peaks else None
    return res


def _update_batch(b: int, p: int, r: int, vocab: int, group: int) -> RolloutBatch:
    """Random full-length sequences (no padding), N(0, 1) advantages, on-policy (no old)."""
    g = torch.Generator().manual_seed(0)
    return RolloutBatch(
        prompt_ids=torch.randint(0, vocab, (b, p), generator=g),
        prompt_mask=torch.ones(b, p, dtype=torch.long),
        response_ids=torch.randint(0, vocab, (b, r), generator=g),
        response_mask=torch.ones(b, r),
        group_index=torch.arange(b) // group,
        truncated=torch.zeros(b, dtype=torch.bool),
        advantages=torch.randn(b, r, generator=g),
        old_is_current=True,  # on-policy: the update's own detached log-probs are pi_old
    )


def sec_update_05b(args, dev: torch.device, log) -> dict:
    z = sizes(args, "update_05b")
    config, dtype = shape(args, tiny.qwen2_0_5b_config)
    b, p, r = z.b, z.p, z.r
    group = 8 if b % 8 == 0 else b
    cfg, _ = load_config(None, [
        "model.actor_model_name_or_path=random:qwen2-0.5b", f"model.device={dev}",
        "data.task=arithmetic", "trainer.algorithm=grpo", f"trainer.batch_size={b // group}",
        f"trainer.samples_per_prompt={group}", f"trainer.micro_batch_size={b}",
        f"trainer.max_new_tokens={r}", f"trainer.max_length={p + r}", "trainer.lr=1e-6",
        "trainer.kl.coef=0", "lora.enable_lora=false",
    ])  # fmt: skip
    base = random_model(config, dev, dtype)
    models = build_models(cfg, base, lambda: None, log.info)  # checkpointing toggled below
    run = bare_run(cfg, models, dev, dtype, log)
    if args.train_mode:
        base.train()
    n_params = count_parameters(base)[1]
    batch = _update_batch(b, p, r, config.vocab_size, group)
    tokens = b * (p + r)
    out = {"shape": "tiny" if args.tiny else "qwen2.5-0.5b", "params": n_params,
           "seqs": b, "prompt_len": p, "response_len": r, "tokens_per_step": tokens,
           "mfu_formula": "6 * params * tokens / step_s / 790e12 (all params, tied emb once)",
           "variants": {}}  # fmt: skip
    compiled = False
    for variant in args.update_variants.split(","):
        micro = int(variant.split("+")[0].removeprefix("mb"))
        try:
            if "+gc" in variant:
                base.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                base.gradient_checkpointing_disable()
            run.state.micro_batch_size = micro
            lpm.FUSED = "+eager_head" not in variant  # A/B: the log-prob head's fused chunks
            if "+compile" in variant and not compiled:  # trainer.compile (stays on: list last)
                compile_forward(base, True, dev)
                compiled = True

            def step(run=run, batch=batch):
                update(run, batch, run.update_generator)

            warmup_s = timed(step, dev)  # warm-up (allocator, cuBLAS, AdamW state, compile)
            reset_peak(dev)
            times = [timed(step, dev) for _ in range(z.iters)]
            s = statistics.median(times)
            out["variants"][variant] = {
                "micro_batch": micro, "gc_active": gc_active(base), "compiled": compiled,
                "fused_head": lpm.FUSED,
                "warmup_step_s": warmup_s, "step_s": s,
                "tok_s": tokens / s, "mfu": 6 * n_params * tokens / s / PEAK_FLOPS,
                "peak_gib": peak_gib(dev),
            }  # fmt: skip
            if args.profile:  # top kernels of a few more steps (after the timing)
                out["variants"][variant]["profile"] = profile_or_error(
                    step, dev, steps=args.profile_steps, step_s=s
                )
        except Exception as err:  # noqa: BLE001
            out["variants"][variant] = {"error": _err(err)}
        free(dev)
    return out


def sec_ppo_7b(args, dev: torch.device, log) -> dict:
    z = sizes(args, "ppo_7b")
    config, dtype = shape(args, tiny.qwen2_7b_config)
    b, p, new, micro = z.b, z.p, z.new, (2 if args.tiny else args.ppo_micro)
    overrides = [
        "model.actor_model_name_or_path=random:qwen2-7b", f"model.device={dev}",
        "model.use_gradient_checkpointing=true", "data.task=arithmetic", "trainer.algorithm=ppo",
        f"trainer.batch_size={b}", "trainer.samples_per_prompt=1",
        f"trainer.micro_batch_size={micro}", f"trainer.max_new_tokens={new}",
        f"trainer.max_length={p + new + 64}", "trainer.kl.coef=0.05", "trainer.lr=1e-5",
    ]  # fmt: skip
    cfg, _ = load_config(None, overrides)
    engines = [e.strip() for e in args.ppo_engines.split(",") if e.strip()]
    # Random weights: no file for build_run to load, so the model is built on the GPU and
    # handed to build_models (one base: actor adapter 'default', critic adapter 'critic' +
    # value head, reference = adapters off); bare_run stands in for tokenizer/data/rewards.
    # QLoRA variants load a checkpoint of the same random base (ppo_memory).
    base = random_model(config, dev, dtype)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, config.vocab_size - 100, (p,), generator=g).tolist() for _ in range(b)
    ]
    # eos = vocab_size: a real id is never sampled from vocab_size logits, so every response
    # runs the full `new` tokens (the worst-case shape) with either engine
    eos, pad = [config.vocab_size], config.pad_token_id or 0
    out = {"shape": "tiny" if args.tiny else "qwen2-7b",
           "weights_gib": sum(x.numel() * x.element_size() for x in base.parameters()) / GIB,
           "prompts": b, "prompt_len": p, "new_tokens": new, "micro_batch": micro,
           "lora_r": cfg.lora.lora_r, "engines": {}}  # fmt: skip
    import ppo_memory  # imports this module: not at the top

    ckpt: dict = {}
    if any(ppo_memory.is_qlora(e) for e in engines):
        try:
            ckpt = out["checkpoint"] = ppo_memory.save_checkpoint(args, base)
        except Exception as err:  # noqa: BLE001 - the bf16 variants still run
            out["checkpoint"] = {"error": _err(err)}
    plain = [e for e in engines if not ppo_memory.is_qlora(e)]
    if plain:
        _ppo_plain(args, dev, log, cfg, base, plain, out, prompts=prompts, eos=eos, pad=pad)
    del base
    free(dev)
    for engine in [e for e in engines if ppo_memory.is_qlora(e)]:
        try:
            if "path" not in ckpt:
                raise RuntimeError(f"no checkpoint to quantise: {out['checkpoint'].get('error')}")
            out["engines"][engine] = ppo_memory.run_qlora(
                dev, dtype, log, overrides, ckpt, prompts, eos, pad
            )
        except Exception as err:  # noqa: BLE001 - e.g. no bitsandbytes / no CUDA
            out["engines"][engine] = {"error": _err(err)}
        free(dev)
    for engine, res in out["engines"].items():
        ppo_memory.with_estimate(res, overrides, engine, z, dtype, config)
    return out


def _ppo_plain(args, dev, log, cfg, base, engines, out, **prompt_kw) -> None:
    """PPO steps on the bf16 base, one rollout engine after the other (hf first: the fast
    engine keeps buffers)."""
    if args.train_mode:
        base.train()
    models = build_models(cfg, base, lambda: None, log.info)
    out["gc_active"] = gc_active(models.policy)
    run = bare_run(cfg, models, dev, base.dtype, log, **prompt_kw)
    for engine in engines:
        try:
            run.engine = build_engine(engine)
            res = run_steps(run, 2, dev)  # step 1 warms up (and captures CUDA graphs)
            res["response_len_mean"] = res["median"].get("response_length")
            peaks = res["phase_peak_gib"]
            res["peak_gib"] = peaks.get("step") if peaks else None
            out["engines"][engine] = res
        except Exception as err:  # noqa: BLE001
            out["engines"][engine] = {"error": _err(err)}
        finally:
            getattr(run.engine, "release", lambda: None)()
            run.engine = None
            free(dev)


def _naive_logprobs(h, w, y, temperature=1.0):
    """Full (N, V) float32 logits, log_softmax, gather: what a plain HF forward does."""
    logp = torch.log_softmax(F.linear(h, w).float() / temperature, dim=-1)
    return logp.gather(-1, y[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _head_step(fn, h0, w0, y, g_lp, g_ent, dev, iters):
    """Warm-up, then time ``iters`` forward + backward passes of ``fn(h, w) -> (logp, ent)``.
    Returns (result dict, (logp, grad_h, grad_w) of the warm-up in fp32)."""
    h, w = h0.clone().requires_grad_(True), w0.clone().requires_grad_(True)

    def step():
        h.grad = w.grad = None
        lp, ent = fn(h, w)
        ((lp * g_lp).sum() + (ent * g_ent).sum()).backward()
        return lp

    lp = step()
    first = (lp.detach().float(), h.grad.float(), w.grad.float())
    del lp
    h.grad = w.grad = None
    free(dev)
    base = torch.cuda.memory_allocated(dev) / GIB if dev.type == "cuda" else None
    reset_peak(dev)
    times = [timed(step, dev) for _ in range(iters)]
    peak = peak_gib(dev)
    enqueue = []  # host seconds to queue one step (no sync inside): launch/host cost
    for _ in range(iters):
        sync(dev)
        t0 = time.perf_counter()
        step()
        enqueue.append(time.perf_counter() - t0)
    sync(dev)
    return {"step_s": statistics.median(times), "enqueue_s": statistics.median(enqueue),
            "peak_gib": peak, "extra_gib": None if peak is None else peak - base}, first  # fmt: skip


def sec_logprob_memory(args, dev: torch.device, log) -> dict:
    z = sizes(args, "logprob_memory")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(z.n, z.h, generator=g).to(dev, dtype)
    w0 = (torch.randn(z.vocab, z.h, generator=g) * 0.02).to(dev, dtype)
    y = torch.randint(0, z.vocab, (z.n,), generator=g).to(dev)
    g_lp, g_ent = torch.randn(z.n, generator=g).to(dev), torch.randn(z.n, generator=g).to(dev) / 100
    out = {
        "tokens": z.n,
        "hidden": z.h,
        "vocab": z.vocab,
        "dtype": str(dtype),
        "chunk": z.chunk,
        "what": "LM head only: log-prob + entropy, forward + backward (grads to h and W)",
    }

    def chunked(fused: bool):
        def fn(h, w):
            lpm.FUSED = fused  # the per-chunk elementwise work compiled (CUDA default) or eager
            return chunked_logprobs_entropy(h, w, y, chunk_size=z.chunk)

        return fn

    methods = {"chunked_eager": chunked(False), "chunked": chunked(True),
               "naive": lambda h, w: _naive_logprobs(h, w, y)}  # fmt: skip
    first = {}
    for name, fn in methods.items():
        try:
            out[name], first[name] = _head_step(fn, h0, w0, y, g_lp, g_ent, dev, z.iters)
        except Exception as err:  # noqa: BLE001 - e.g. the naive path running out of memory
            out[name] = {"error": _err(err)}
        free(dev)
    lpm.FUSED = True
    for name in ("chunked_eager", "chunked"):
        if name in first and "naive" in first:
            pairs = zip(("logp", "grad_h", "grad_w"), first[name], first["naive"])
            out[f"{name}_max_abs_diff"] = {k: float((a - b).abs().max()) for k, a, b in pairs}
    return out


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


def sec_packing(args, dev: torch.device, log) -> dict:
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
        batch = _padded_batch(plen, rlen, n)
        real = float(plen.sum() + rlen.sum())
        padded.append(real / (batch.size * (int(plen.max()) + int(rlen.max()))))
        danka.append(effective_token_ratio(batch, micro))
        packed.append(effective_token_ratio(batch, micro, pack_len=4096))
    return {"source": "data" if lengths else "synthetic N(120,40) / N(180,80)",
            "seqs_per_batch": prompts_per_step * n, "micro_batch": micro, "batches": batches,
            "padded_ratio": statistics.mean(padded), "danka_ratio": statistics.mean(danka),
            "packed_ratio": statistics.mean(packed), "goal": 0.95}  # fmt: skip


def _padded_batch(plen: torch.Tensor, rlen: torch.Tensor, n: int) -> RolloutBatch:
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


def sec_packing_step(args, dev: torch.device, log) -> dict:
    import packing_step  # imports this module: not at the top

    return packing_step.sec_packing_step(args, dev, log)


SECTIONS = {
    "grpo_step": sec_grpo_step,
    "update_05b": sec_update_05b,
    "ppo_7b": sec_ppo_7b,
    "logprob_memory": sec_logprob_memory,
    "packing": sec_packing,
    "packing_step": sec_packing_step,
}


# ------------------------------------------------------------------------- reporting


def _err(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()[:500]


def _f(x, fmt="{:.2f}") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return fmt.format(x) if isinstance(x, (int, float)) else str(x)


def summarize(name: str, res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of one section for the final table."""
    rows = []
    if name == "grpo_step":
        for key, v in res["variants"].items():
            if "error" in v:
                rows.append((key, "ERROR", v["error"][:60]))
                continue
            ph = v["median"]
            tag = f"{key} (gc {'on' if v['gc_active'] else 'OFF'})"
            rows.append((f"{tag} median step s", _f(v["median_step_s"]),
                         f"TRL {v['trl_step_s']} -> x{v['speedup_vs_trl']:.2f}"))  # fmt: skip
            rows.append((f"{key} rollout/reward/logprobs/update s",
                         "/".join(_f(ph.get(f"time/{k}")) for k in ("rollout", "reward", "logprobs", "update")),
                         f"first step {_f(v['first_step_s'])} s"))  # fmt: skip
            peaks = v["phase_peak_gib"] or {}
            rows.append(
                (
                    f"{key} peak GiB (rollout/update)",
                    _f(v["peak_gib"]),
                    f"TRL {v['trl_peak_gib']}; {_f(peaks.get('rollout'))}/{_f(peaks.get('update'))}",
                )
            )
    elif name == "update_05b":
        for key, v in res["variants"].items():
            if "error" in v:
                rows.append((key, "ERROR", v["error"][:60]))
                continue
            gc_tag = "" if "+gc" not in key or v["gc_active"] else " (gc INACTIVE)"
            rows.append(
                (
                    f"{key}{gc_tag} tok/s | MFU",
                    f"{v['tok_s'] / 1e3:.1f}k | {v['mfu']:.1%}",
                    "HF 77k | 29%; goal MFU >= 45%",
                )
            )
            rows.append((f"{key} peak GiB", _f(v["peak_gib"]), "HF 27.3; goal <= 12"))
    elif name == "ppo_7b":
        rows.append(
            ("weights GiB | gc active", f"{res['weights_gib']:.2f} | {res.get('gc_active')}", "")
        )
        for eng, v in res["engines"].items():
            if "error" in v:
                rows.append((eng, "ERROR", v["error"][:60]))
                continue
            pk = v["phase_peak_gib"] or {}
            phases = "/".join(_f(pk.get(k)) for k in ("rollout", "logprobs", "values", "update"))
            rows.append(
                (
                    f"{eng}: peak GiB (rollout/logp/values/update)",
                    _f(v["peak_gib"]),
                    f"{phases}; goal <= 16",
                )
            )
            rows.append((f"{eng}: step s | response tokens", f"{_f(v['median_step_s'])} | "
                         f"{_f(v['response_len_mean'], '{:.0f}')}", ""))  # fmt: skip
            vs = v.get("vs_estimate", {}).get("step", {})
            rows.append((f"{eng}: danka estimate GiB | error", f"{_f(vs.get('estimate_gib'))} | "
                         f"{_f(vs.get('rel_error'), '{:+.1%}')}", "goal within 15%"))  # fmt: skip
    elif name == "packing_step":
        for shape_name, sh in res["shapes"].items():
            for key, v in sh.get("variants", {}).items():
                value = "ERROR" if "error" in v else (
                    f"{_f(v['step_s'], '{:.3f}')} s | {_f(v['peak_gib'])} GiB | "
                    f"{v['effective_token_ratio']:.0%} real")  # fmt: skip
                rows.append((f"{shape_name} {key}", value, v.get("error", "")[:60]))
            for key, r in sh.get("packed_vs_padded", {}).items():
                rows.append((f"{shape_name} {key} padded/packed step time",
                             _f(r["padded_over_packed_step_time"]), ">1: packing faster"))  # fmt: skip
    elif name == "logprob_memory":
        for k in ("chunked_eager", "chunked", "naive"):
            v = res.get(k, {})
            rows.append((f"{k} extra GiB | step s", "ERROR" if "error" in v else
                         f"{_f(v.get('extra_gib'))} | {_f(v.get('step_s'), '{:.4f}')}",
                         v.get("error", "")[:60] or f"peak {_f(v.get('peak_gib'))} GiB"))  # fmt: skip
        for k in ("chunked_eager", "chunked"):
            if f"{k}_max_abs_diff" in res:
                d = res[f"{k}_max_abs_diff"]
                diffs = " / ".join(f"{d[x]:.1e}" for x in ("logp", "grad_h", "grad_w"))
                rows.append((f"{k} vs naive max |diff| logp / grad_h / grad_w", diffs, ""))
    elif name == "packing":
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
                f"danka data.packing, micro-batch {res['micro_batch']}, rows of 4096",
                f"{res['packed_ratio']:.1%}",
                "goal >= 95%",
            )
        )
    return rows


def print_table(report: dict) -> None:
    lines = []
    for name, sec in report["sections"].items():
        if sec["status"] != "ok":
            lines.append((name, "ERROR", sec["error"][:80]))
            continue
        try:
            for metric, value, ref in summarize(name, sec["results"]):
                lines.append((name, f"{metric}: {value}", ref))
        except Exception as err:  # noqa: BLE001 - a table bug must not hide the JSON
            lines.append((name, "table error", _err(err)))
        lines.append((name, f"wall {sec['wall_s']:.1f} s", ""))
    w0 = max(len(a) for a, _, _ in lines) if lines else 8
    w1 = max(len(b) for _, b, _ in lines) if lines else 8
    print(
        f"\ndanka training benchmark: {report['device']}  torch {report['torch']}  "
        f"transformers {report['transformers']}{'  (TINY: timings meaningless)' if report['tiny'] else ''}"
    )
    print("-" * (w0 + w1 + 40))
    for a, b, c in lines:
        print(f"{a:<{w0}}  {b:<{w1}}  {c}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of sections")
    ap.add_argument("--model", default=SMOLLM2, help="grpo_step policy (hub id or folder)")
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
        help="update_05b: mb<micro-batch>[+gc][+compile][+eager_head], comma-separated "
        "(+compile: trainer.compile, stays on for the variants after it; +eager_head: the "
        "log-prob head's per-chunk work eager instead of compiled)",
    )
    ap.add_argument(
        "--ppo-engines",
        default="hf,fast",
        help="ppo_7b rollout engines: hf, fast, hf-qlora (NF4 base through model.load_in_4bit)",
    )
    ap.add_argument("--ckpt-dir", help="ppo_7b qlora: where the random 7B checkpoint goes "
                    "(default /dev/shm when it has room, else the temp dir)")  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="update_05b: top CUDA kernels")
    ap.add_argument("--packing-shapes", default="smollm2-135m,qwen2-0.5b", help="packing_step")
    ap.add_argument("--packing-variants", default="mb8,mb8+pack,mb16,mb16+pack,mb64,mb64+pack",
                    help="packing_step: mb<micro-batch>[+pack][+gc], comma-separated")  # fmt: skip
    ap.add_argument("--profile-steps", type=int, default=3, help="steps under the profiler")
    ap.add_argument("--ppo-micro", type=int, default=4, help="ppo_7b micro-batch (seqs)")
    ap.add_argument(
        "--train-mode",
        action="store_true",
        help="put the policy in train mode (danka's loader leaves it in eval "
        "mode, where HF skips gradient checkpointing)",
    )
    ap.add_argument("--verbose", action="store_true", help="show danka's INFO log")
    ap.add_argument("--out", default="bench_train.json")
    args = ap.parse_args(argv)
    if args.tiny:
        args.steps = min(args.steps, 3)
    dev = torch.device(args.device)
    # as in every danka run (load_causal_lm): no cuDNN SDPA. The sections build random
    # models without danka's loader; with cuDNN on, the unpacked micro-batch-8 packing
    # variant hit its NaN gradients on the H200 (2026-11-30, issue 11 #1)
    configure_attention_backends()
    log = quiet_log(args.verbose)
    import transformers

    report = {"args": vars(args), "tiny": args.tiny, "torch": torch.__version__,
              "transformers": transformers.__version__,
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "sections": {}}  # fmt: skip
    for name in [s.strip() for s in args.only.split(",") if s.strip()]:
        t0 = time.perf_counter()
        if name not in SECTIONS:
            sec = {"status": "error", "error": f"unknown section (use {', '.join(SECTIONS)})"}
        else:
            print(f"[bench_train] {name} ...", file=sys.stderr, flush=True)
            try:
                sec = {"status": "ok", "results": SECTIONS[name](args, dev, log)}
            except Exception as err:  # noqa: BLE001 - record, go on with the next section
                traceback.print_exc()
                sec = {"status": "error", "error": _err(err)}
        sec["wall_s"] = time.perf_counter() - t0
        report["sections"][name] = sec
        free(dev)
        Path(args.out).write_text(
            json.dumps(report, indent=2, default=str)
        )  # partial results survive
    print_table(report)
    return report


if __name__ == "__main__":
    sys.modules.setdefault("bench_train", sys.modules[__name__])  # for ppo_memory, packing_step
    main()
