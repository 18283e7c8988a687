"""The 7B PPO memory section's QLoRA variant and its ``danka estimate`` comparison.

QLoRA (``--ppo-engines ...,hf-qlora``): the bitsandbytes NF4 base goes through danka's own
loading path, ``model.load_in_4bit: true`` -> ``danka.trainer.setup.build_model_set`` ->
``danka.models.loading.load_causal_lm`` (``BitsAndBytesConfig``: NF4, double quantisation,
compute dtype bf16) -> ``peft.prepare_model_for_kbit_training`` -> ``build_models``. That
path reads a checkpoint, so the random Qwen2-7B-shaped base is first written once as
safetensors (bf16, ~15 GB) to ``/dev/shm`` when it has the room, else to the temporary
directory (``--ckpt-dir`` overrides), and deleted once loaded. The rollout engine is HF
``generate`` (the fast engine refuses a quantised base).

Every variant also records what ``danka estimate`` (``danka.tools.estimate.estimate_memory``)
predicts for the same settings (engine, quantisation, prompt and response lengths, micro-
batch), next to the measured peaks, with the relative error (estimate - measured) /
measured of the step peak and of each phase (prepare = max of log-probs and values).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import bench_train as bt
import torch

from danka.config import load_config
from danka.planning.memory import estimate_memory
from danka.rollout.base import build_engine

GIB = 2**30
QLORA_SUFFIX = "-qlora"


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
    from danka.trainer.setup import build_model_set

    cfg, _ = load_config(None, overrides + qlora_overrides(ckpt["path"]))
    before = torch.cuda.memory_allocated(dev) / GIB if dev.type == "cuda" else None
    bt.reset_peak(dev)
    t0 = time.perf_counter()
    try:
        models, _ = build_model_set(cfg, dev, log)
    finally:
        shutil.rmtree(ckpt["path"], ignore_errors=True)  # loaded (or failed): free the RAM
    res = {
        "load_s": time.perf_counter() - t0,
        "quantised_linears": quantised_linears(models.policy),
        "gc_active": bt.gc_active(models.policy),
        "versions": _versions(),
    }
    if dev.type == "cuda":  # what the bf16 variants left behind should be ~0
        res["allocated_before_load_gib"] = before
        res["weights_gib"] = torch.cuda.memory_allocated(dev) / GIB - before
        res["load_peak_gib"] = bt.peak_gib(dev)
    run = bt.bare_run(cfg, models, dev, dtype, log, prompts=prompts, eos=eos, pad=pad)
    run.engine = build_engine("hf")
    try:
        res.update(bt.run_steps(run, 2, dev))
    finally:
        run.engine = None
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
        "phases_gib": {k: v / GIB for k, v in plan["phases"].items()},
        "peak_gib": plan["peak"] / GIB,
        "peak_phase": plan["peak_phase"],
        "components_gib": {k: v / GIB for k, v in plan["components"].items()},
        "assumptions": plan["assumptions"],
    }


def rel_error(est: float, measured: float | None) -> float | None:
    return None if not measured else (est - measured) / measured


def compare(est: dict, measured: dict) -> dict:
    """Estimate vs a variant's measured phase peaks (``phase_peak_gib`` of run_steps):
    relative errors of the step peak and per phase; ``within_15pct`` is the issue's bar."""
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
        res["estimate_error"] = bt._err(err)
        return res
    res["estimate"] = est
    if res.get("phase_peak_gib"):
        res["vs_estimate"] = compare(est, res)
    return res
