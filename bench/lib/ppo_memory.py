"""Whole PPO step on the Qwen2-7B shape: peak memory per phase, per rollout engine, against
``danka estimate`` (section ``ppo_7b`` of ``python -m bench train``).

The step: actor LoRA, critic LoRA + value head, reference = adapters off, one random
Qwen2-7B-shaped base, 4 prompts x 512 tokens + exactly 128 new tokens (``--ppo-micro``
sequences per micro-batch), ``--ppo-engines hf,fast,hf-qlora``.

QLoRA (``--ppo-engines ...,hf-qlora``): the bitsandbytes NF4 base goes through danka's own
loading path, ``model.load_in_4bit: true`` -> ``danka.trainer.components.build_model_set`` ->
``danka.models.loading.load_causal_lm`` (``BitsAndBytesConfig``: NF4, double quantisation,
compute dtype bf16) -> ``peft.prepare_model_for_kbit_training`` -> ``build_models``. That
path reads a checkpoint, so the random Qwen2-7B-shaped base is first written once as
safetensors (bf16, ~15 GB) to ``/dev/shm`` when it has the room, else to the temporary
directory (``--ckpt-dir`` overrides), and deleted once loaded. The rollout engine is HF
``generate`` (the fast engine refuses a quantised base).

Every variant also records what ``danka estimate`` (``danka.planning.memory.estimate_memory``)
predicts for the same settings (engine, quantisation, prompt and response lengths, micro-
batch), next to the measured peaks, with the relative error (estimate - measured) /
measured of the step peak and of each phase (prepare = max of log-probs and values).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.lib import danka_side as ds
from bench.lib.common import (
    GIB,
    ROOT,
    child_env,
    error_text,
    fmt,
    free,
    peak_gib,
    reset_peak,
    variant_rows,
)
from bench.lib.training import gc_active, pick_size, random_model, run_steps, shape
from danka.config import load_config
from danka.models import tiny
from danka.planning.memory import estimate_memory
from danka.rollout.base import build_engine

QLORA_SUFFIX = "-qlora"
SIZES = ({"b": 4, "p": 512, "new": 128}, {"b": 2, "p": 32, "new": 16})  # (real, --tiny)


def step_overrides(z, dev: torch.device, micro: int | str) -> list[str]:
    """The PPO step's settings: ``z.b`` prompts x ``z.p`` tokens + ``z.new`` new tokens."""
    return [
        "model.actor_model_name_or_path=random:qwen2-7b", f"model.device={dev}",
        "model.use_gradient_checkpointing=true", "data.task=arithmetic", "trainer.algorithm=ppo",
        f"trainer.batch_size={z.b}", "trainer.samples_per_prompt=1",
        f"trainer.micro_batch_size={micro}", f"trainer.max_new_tokens={z.new}",
        f"trainer.max_length={z.p + z.new + 64}", "loss.kl.coef=0.05", "optim.lr=1e-5",
    ]  # fmt: skip


def random_prompts(config, z) -> tuple[list[list[int]], list[int], int]:
    """(``z.b`` random prompts of ``z.p`` tokens, eos ids, pad id). eos = vocab_size: a real
    id is never sampled from vocab_size logits, so every response runs the full ``z.new``
    tokens (the worst-case shape) with either engine."""
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, config.vocab_size - 100, (z.p,), generator=g).tolist()
        for _ in range(z.b)
    ]
    return prompts, [config.vocab_size], config.pad_token_id or 0


def ppo_7b(args, dev: torch.device, log) -> dict:
    z = pick_size(args, SIZES)
    config, dtype = shape(args, tiny.qwen2_7b_config)
    b, p, new, micro = z.b, z.p, z.new, (2 if args.tiny else args.ppo_micro)
    overrides = step_overrides(z, dev, micro)
    cfg, _ = load_config(None, overrides)
    engines = [e.strip() for e in args.ppo_engines.split(",") if e.strip()]
    # Random weights: no file to load, so the model is built on the GPU and wrapped by the
    # trainer's model set (one base: actor adapter 'default', critic adapter 'critic' +
    # value head, reference = adapters off); a bench run stands in for tokenizer, data and
    # rewards. QLoRA variants load a checkpoint of the same random base.
    base = random_model(config, dev, dtype)
    prompts, eos, pad = random_prompts(config, z)
    out = {"shape": "tiny" if args.tiny else "qwen2-7b",
           "weights_gib": sum(x.numel() * x.element_size() for x in base.parameters()) / GIB,
           "prompts": b, "prompt_len": p, "new_tokens": new, "micro_batch": micro,
           "lora_r": cfg.lora.lora_r, "engines": {}}  # fmt: skip
    ckpt: dict = {}
    if any(is_qlora(e) for e in engines):
        try:
            ckpt = out["checkpoint"] = save_checkpoint(args, base)
        except Exception as err:  # noqa: BLE001 - the bf16 variants still run
            out["checkpoint"] = {"error": error_text(err)}
    plain = [e for e in engines if not is_qlora(e)]
    if plain:
        _ppo_plain(args, dev, log, cfg, base, plain, out, prompts=prompts, eos=eos, pad=pad)
    del base
    free(dev)
    for engine in [e for e in engines if is_qlora(e)]:
        try:
            if "path" not in ckpt:
                raise RuntimeError(f"no checkpoint to quantise: {out['checkpoint'].get('error')}")
            out["engines"][engine] = run_qlora(dev, dtype, log, overrides, ckpt, prompts, eos, pad)
        except Exception as err:  # noqa: BLE001 - e.g. no bitsandbytes / no CUDA
            out["engines"][engine] = {"error": error_text(err)}
        free(dev)
    for engine, res in out["engines"].items():
        with_estimate(res, overrides, engine, z, dtype, config)
    return out


def _ppo_plain(args, dev, log, cfg, base, engines, out, **prompt_kw) -> None:
    """PPO steps on the bf16 base, one rollout engine after the other (hf first: the fast
    engine keeps buffers)."""
    if args.train_mode:
        base.train()
    models = ds.wrap_models(cfg, base, log)
    out["gc_active"] = gc_active(models.policy)
    run = ds.build_run_for_bench(cfg, models, dev, base.dtype, log, **prompt_kw)
    for engine in engines:
        try:
            ds.set_engine(run, build_engine(engine))
            res = run_steps(run, 2, dev)  # step 1 warms up (and captures CUDA graphs)
            res["response_len_mean"] = res["median"].get("response_length")
            peaks = res["phase_peak_gib"]
            res["peak_gib"] = peaks.get("step") if peaks else None
            out["engines"][engine] = res
        except Exception as err:  # noqa: BLE001
            out["engines"][engine] = {"error": error_text(err)}
        finally:
            ds.close_run(run)
            ds.set_engine(run, None)
            free(dev)


def is_qlora(engine: str) -> bool:
    return engine.endswith(QLORA_SUFFIX)


def checkpoint_dir(args, need_bytes: int) -> Path:
    """``--ckpt-dir``, else /dev/shm when it has ``need_bytes`` + 2 GiB free, else the
    temporary directory (a container's /dev/shm is often 64 MB)."""
    if args.ckpt_dir:
        return Path(args.ckpt_dir)
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free >= need_bytes + 2 * GIB:
        return shm / "danka_bench_random_7b"
    return Path(tempfile.gettempdir()) / "danka_bench_random_7b"


def save_checkpoint(args, base: torch.nn.Module) -> dict:
    """Write the random base as a model folder (config + safetensors); its path and cost."""
    nbytes = sum(p.numel() * p.element_size() for p in base.parameters())
    path = checkpoint_dir(args, nbytes)
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    base.save_pretrained(str(path), safe_serialization=True, max_shard_size="5GB")
    return {"path": str(path), "gib": nbytes / GIB, "save_s": time.perf_counter() - t0}


def quantised_linears(model: torch.nn.Module) -> int:
    """How many bitsandbytes 4/8-bit linear layers the model holds (proof of the NF4 base)."""
    return sum(type(m).__name__ in ("Linear4bit", "Linear8bitLt") for m in model.modules())


def run_qlora(dev, dtype, log, overrides: list[str], ckpt: dict, prompts, eos, pad) -> dict:
    """Two PPO ``train_step`` calls on the NF4 base loaded by danka's own path."""
    cfg, _ = load_config(None, overrides + qlora_overrides(ckpt["path"]))
    before = torch.cuda.memory_allocated(dev) / GIB if dev.type == "cuda" else None
    reset_peak(dev)
    t0 = time.perf_counter()
    try:
        models = ds.load_models(cfg, dev, log)
    finally:
        shutil.rmtree(ckpt["path"], ignore_errors=True)  # loaded (or failed): free the RAM
    res = {
        "load_s": time.perf_counter() - t0,
        "quantised_linears": quantised_linears(models.policy),
        "gc_active": gc_active(models.policy),
        "versions": _versions(),
    }
    if dev.type == "cuda":  # what the bf16 variants left behind should be ~0
        res["allocated_before_load_gib"] = before
        res["weights_gib"] = torch.cuda.memory_allocated(dev) / GIB - before
        res["load_peak_gib"] = peak_gib(dev)
    run = ds.build_run_for_bench(cfg, models, dev, dtype, log, prompts=prompts, eos=eos, pad=pad)
    ds.set_engine(run, build_engine("hf"))
    try:
        res.update(run_steps(run, 2, dev))
    finally:
        ds.set_engine(run, None)
    res["response_len_mean"] = res["median"].get("response_length")
    peaks = res["phase_peak_gib"]
    res["peak_gib"] = peaks.get("step") if peaks else None
    return res


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("bitsandbytes", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def qlora_overrides(path: str) -> list[str]:
    return [
        f"model.actor_model_name_or_path={path}",
        "model.load_in_4bit=true",
        "rollout.engine=hf",
    ]


def estimate_overrides(engine: str, prompt_len: int, dtype: torch.dtype) -> list[str]:
    """The settings ``danka estimate`` needs to describe this variant exactly."""
    out = [f"rollout.engine={engine.removesuffix(QLORA_SUFFIX)}"]
    out += [f"data.max_prompt_length={prompt_len}", f"model.torch_dtype={str(dtype)[6:]}"]
    return out + (["model.load_in_4bit=true"] if is_qlora(engine) else [])


def estimate(overrides: list[str], model_config) -> dict:
    """``danka estimate``'s phases and peak (GiB) for the config ``overrides`` describe."""
    cfg, _ = load_config(None, overrides)
    plan = estimate_memory(cfg, model_config=model_config)
    return {
        "phases_gib": {k: v / GIB for k, v in plan.phases.items()},
        "peak_gib": plan.peak / GIB,
        "peak_phase": plan.peak_phase,
        "components_gib": {k: v / GIB for k, v in plan.components.items()},
        "assumptions": dataclasses.asdict(plan.assumptions),
    }


def start_estimate(config: Path, overrides: list[str], budget: str | None):
    """``danka estimate CONFIG OVERRIDES --json`` in a child process (CPU only: the model's
    config is read, nothing loaded), started now and read by :func:`read_estimate`."""
    cmd = [sys.executable, "-m", "danka", "estimate", str(config), *overrides, "--json"]
    cmd += ["--gpu-memory", budget] if budget else []
    pipe = subprocess.PIPE
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=pipe, stderr=pipe, text=True)


def read_estimate(proc) -> dict:
    """The plan in GiB as :func:`compare` reads it: ``phases_gib`` (rollout,
    prepare, update), ``peak_gib``, and the planned sizes' line."""
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 0:
        return {"error": err.strip().splitlines()[-3:]}
    plan = json.loads(out[out.index("{") :])
    return {
        "phases_gib": {k: v / GIB for k, v in plan["phases"].items()},
        "peak_gib": plan["peak"] / GIB,
        "peak_phase": plan["peak_phase"],
        "components_gib": {k: v / GIB for k, v in plan["components"].items()},
        "micro_batch_plan": plan.get("micro_batch_plan"),
        "gpu_memory_gib": plan.get("gpu_memory", 0) / GIB or None,
    }


def rel_error(est: float, measured: float | None) -> float | None:
    return None if not measured else (est - measured) / measured


def compare(est: dict, measured: dict) -> dict:
    """Estimate vs a variant's measured phase peaks (``phase_peak_gib`` of run_steps):
    relative errors of the step peak and per phase; ``within_15pct``: the error is at most 15%."""
    peaks = measured.get("phase_peak_gib") or {}
    ph = est["phases_gib"]
    pairs = {
        "rollout": (ph["rollout"], peaks.get("rollout")),
        "prepare": (ph["prepare"], max(peaks.get("logprobs", 0), peaks.get("values", 0)) or None),
        "update": (ph["update"], peaks.get("update")),
        "step": (est["peak_gib"], peaks.get("step")),
    }
    out = {k: {"estimate_gib": e, "measured_gib": m, "rel_error": rel_error(e, m)}
           for k, (e, m) in pairs.items()}  # fmt: skip
    err = out["step"]["rel_error"]
    out["within_15pct"] = None if err is None else abs(err) <= 0.15
    return out


def with_estimate(res: dict, overrides: list[str], engine: str, z, dtype, model_config) -> dict:
    """``res`` plus ``estimate`` (or ``estimate_error``) and, when measured, ``vs_estimate``."""
    try:
        est = estimate(overrides + estimate_overrides(engine, z.p, dtype), model_config)
    except Exception as err:  # noqa: BLE001 - the measurement stays valid without it
        res["estimate_error"] = error_text(err)
        return res
    res["estimate"] = est
    if res.get("phase_peak_gib"):
        res["vs_estimate"] = compare(est, res)
    return res


def ppo_rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows of ``ppo_7b`` for the final table."""

    def rows_of(eng: str, v: dict) -> list:
        pk = v["phase_peak_gib"] or {}
        phases = "/".join(fmt(pk.get(k)) for k in ("rollout", "logprobs", "values", "update"))
        vs = v.get("vs_estimate", {}).get("step", {})
        return [
            (f"{eng}: peak GiB (rollout/logp/values/update)", fmt(v["peak_gib"]), phases),
            (f"{eng}: step s | response tokens", f"{fmt(v['median_step_s'])} | "
             f"{fmt(v['response_len_mean'], '{:.0f}')}", ""),
            (f"{eng}: danka estimate GiB | error", f"{fmt(vs.get('estimate_gib'))} | "
             f"{fmt(vs.get('rel_error'), '{:+.1%}')}", ""),
        ]  # fmt: skip

    weights = f"{res['weights_gib']:.2f} | {res.get('gc_active')}"
    return [("weights GiB | gc active", weights, "")] + variant_rows(res["engines"], rows_of)
