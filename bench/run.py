"""One entry point for danka's benchmarks; every result is JSON under bench/results/.

    python bench/run.py rollout --shape smollm2-135m --prompts 64 --new-tokens 256 --lora
    python bench/run.py train --only update_05b,logprob_memory --update-variants mb16,mb16+gc
    python bench/run.py trl --model PATH --variants lora,full   # TRL GRPOTrainer vs danka

``rollout`` runs each side (danka's fast engine; HF generate with a dynamic cache; HF with
a static cache + torch.compile) in its OWN fresh Python process, then writes one JSON with
the environment (versions, GPU, commit), both sides of every ratio, and first-call times.
``train`` runs ``bench/bench_train.py`` sections in a fresh process and wraps their JSON
with the same environment record. ``trl`` runs ``bench/bench_trl.py``: TRL's GRPOTrainer
and ``danka train`` on the same GRPO settings, each variant and side in a fresh process.
``--out-dir`` (default bench/results) and, when set,
``$OUT`` receive a copy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def environment() -> dict:
    """Versions, GPU and commit, read in a child process (this one never imports CUDA)."""
    code = (
        "import json, torch, transformers, peft;"
        "d = {'torch': torch.__version__, 'transformers': transformers.__version__,"
        " 'peft': peft.__version__, 'cuda': torch.version.cuda,"
        " 'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None};"
        "print(json.dumps(d))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    env = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    env.update(
        python=platform.python_version(),
        commit=commit.stdout.strip() or None,
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    return env


def _child(cmd: list[str], timeout: int) -> dict:
    """Run one benchmark side in a fresh process; its JSON, or the error it died with."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-5:], "rc": proc.returncode}
    return {"wall_s": time.perf_counter() - t0}


def _side(cmd: list[str], out: Path, timeout: int) -> dict:
    """Run one side writing its JSON to ``out`` (``--out`` added); that JSON plus the
    child's status (wall time or error)."""
    out.unlink(missing_ok=True)
    status = _child(cmd + ["--out", str(out)], timeout)
    res = json.loads(out.read_text()) if out.exists() else {}
    res.update(status)
    return res


def _ratio(a_name: str, a: float, b_name: str, b: float) -> dict:
    """Both sides of a tok/s ratio and the ratio, as every result JSON keeps them."""
    return {f"{a_name}_tok_s": a, f"{b_name}_tok_s": b, "ratio": a / b}


def rollout(args) -> dict:
    sides = args.sides.split(",")
    common = ["--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens)]
    common += ["--prompt-len", str(args.prompt_len)]
    common += ["--shape", args.shape] if args.shape else ["--model", args.model]
    res: dict = {
        "bench": "rollout",
        "model": args.shape or args.model,
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "prompt_len": args.prompt_len,
        "settings": "bf16, sampling temperature 1, EOS off (every sequence generates "
        "new_tokens), each side in its own fresh process; HF sides on the plain model",
        "sides": {},
    }
    tmp = Path(args.out_dir) / "_sides"
    tmp.mkdir(parents=True, exist_ok=True)
    for side in sides:
        cmd = [sys.executable, "bench/bench_rollout.py", "--side", side]
        fast = side.startswith("fast")
        cmd += common + (["--lora"] if args.lora and fast else [])
        cmd += ["--profile"] if args.profile and fast else []
        side_res = res["sides"][side] = _side(cmd, tmp / f"{side}.json", args.timeout)
        shown = {k: v for k, v in side_res.items() if k != "greedy_tokens" and "profile" not in k}
        print(side, shown, flush=True)
    s = res["sides"]
    fast = s.get("fast", {})
    variants = ("fast-whole-cache", "fast-compile", "fast-triton", "fast-compile-triton")
    prefixes = ("", "lora_", "lora_base_")  # plain, LoRA live, LoRA folded (lora_compute base)
    for other in variants:  # engine variants vs the default
        o = s.get(other, {})
        for prefix in prefixes:
            if f"{prefix}tok_s" in fast and f"{prefix}tok_s" in o:
                res[f"{other.replace('-', '_')}_{prefix}over_fast"] = _ratio(
                    other, o[f"{prefix}tok_s"], "fast", fast[f"{prefix}tok_s"]
                )
        o.pop("greedy_tokens", None)
    for hf in ("hf-dynamic", "hf-static"):  # every fast variant against each HF path
        base = s.get(hf, {}).get("tok_s")
        for side in ("fast",) + variants:
            for prefix in prefixes:
                got = s.get(side, {}).get(f"{prefix}tok_s")
                if base and got:
                    key = f"{side.replace('-', '_')}_{prefix}over_{hf.replace('-', '_')}"
                    res[key] = _ratio(
                        f"{side}_{prefix}".rstrip("_"), got, hf.replace("-", "_"), base
                    )
    a, b = fast.pop("greedy_tokens", None), s.get("hf-dynamic", {}).pop("greedy_tokens", None)
    if a and b:
        same = [[int(x == y) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]
        res["greedy_token_agreement"] = sum(map(sum, same)) / sum(map(len, same))
    shutil.rmtree(tmp, ignore_errors=True)
    return res


def train(args) -> dict:
    tmp = Path(args.out_dir) / "_train.json"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "bench/bench_train.py", "--only", args.only, "--out", str(tmp)]
    cmd += args.extra
    status = _child(cmd, args.timeout)
    res = {"bench": "train", "sections": args.only}
    if tmp.exists():
        res["result"] = json.loads(tmp.read_text())
        tmp.unlink()
    res.update(status)
    return res


def trl(args) -> dict:
    """TRL vs danka GRPO step, per variant (lora, full), each side in a fresh process."""
    common = ["--prompts", str(args.prompts), "--generations", str(args.generations)]
    common += ["--new-tokens", str(args.new_tokens), "--micro", str(args.micro)]
    common += ["--steps", str(args.steps)]
    common += ["--tiny"] if args.tiny else ["--model", args.model]
    common += [f"--danka-set={o}" for o in args.danka_set]
    res: dict = {
        "bench": "trl",
        "model": "tiny" if args.tiny else args.model,
        "settings": f"GRPO, {args.prompts} prompts x {args.generations} generations, "
        f"{args.new_tokens} max new tokens, micro-batch {args.micro}, gradient checkpointing, "
        "bf16 on a GPU, beta 0, temperature 1, LoRA r16 all-linear (lora) or full-parameter; "
        "median step s after the first step; peak = torch.cuda.max_memory_allocated",
        "variants": {},
    }
    tmp = Path(args.out_dir) / "_sides"
    tmp.mkdir(parents=True, exist_ok=True)
    for variant in args.variants.split(","):
        sides = {}
        for side in args.sides.split(","):  # danka-eager: danka with --eager-head (A/B)
            cmd = [sys.executable, "bench/bench_trl.py", "--side", side.split("-")[0]]
            cmd += ["--variant", variant] + (["--eager-head"] if side == "danka-eager" else [])
            path = tmp / f"trl_{variant}_{side}.json"
            sides[side] = _side(cmd + common, path, args.timeout)
            print(variant, side, {k: v for k, v in sides[side].items() if k != "step_s"})
        entry: dict = {"sides": sides}
        t, d = (sides.get(s, {}).get("median_step_s") for s in ("trl", "danka"))
        if t and d:
            entry["trl_over_danka_step_time"] = t / d
        pt, pd = (sides.get(s, {}).get("peak_gib") for s in ("trl", "danka"))
        if pt and pd:
            entry["danka_over_trl_peak"] = pd / pt
        e = sides.get("danka-eager", {}).get("median_step_s")
        if t and e:
            entry["trl_over_danka_eager_head_step_time"] = t / e
        res["variants"][variant] = entry
    shutil.rmtree(tmp, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--name", help="result file name (default: derived from the settings)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per child process")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rollout", allow_abbrev=False)
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--shape", help="random weights: smollm2-135m | qwen2-0.5b")
    src.add_argument("--model", help="hub id, local folder or .gguf")
    r.add_argument("--prompts", type=int, default=64)
    r.add_argument("--new-tokens", type=int, default=256)
    r.add_argument("--prompt-len", type=int, default=160)
    r.add_argument("--lora", action="store_true", help="fast side also with a live LoRA")
    r.add_argument("--sides", default="fast,hf-dynamic,hf-static")
    r.add_argument("--profile", action="store_true", help="fast side: top CUDA kernels")
    t = sub.add_parser("train", allow_abbrev=False)
    t.add_argument("--only", default="update_05b,ppo_7b,logprob_memory")
    g = sub.add_parser("trl", allow_abbrev=False)
    gsrc = g.add_mutually_exclusive_group(required=True)
    gsrc.add_argument("--model", help="model path or hub id (both sides load it)")
    gsrc.add_argument("--tiny", action="store_true", help="tiny random model (CPU smoke)")
    g.add_argument("--variants", default="lora,full")
    g.add_argument("--prompts", type=int, default=8)
    g.add_argument("--generations", type=int, default=8)
    g.add_argument("--new-tokens", type=int, default=256)
    g.add_argument("--micro", type=int, default=16)
    g.add_argument("--steps", type=int, default=4)
    g.add_argument("--sides", default="trl,danka", help="trl,danka[,danka-eager] or a subset")
    g.add_argument("--danka-set", action="append", default=[], metavar="KEY=VALUE")
    args, extra = ap.parse_known_args(argv)  # train: other flags go to bench_train.py
    if extra and args.cmd != "train":
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra

    env = environment()
    res = {"rollout": rollout, "train": train, "trl": trl}[args.cmd](args)
    res["environment"] = env
    if args.cmd == "rollout":
        model = Path(str(res["model"])).stem
        default = f"rollout_{model}_{args.prompts}x{args.new_tokens}"
    elif args.cmd == "trl":
        default = f"trl_{Path(str(res['model'])).stem}_{args.prompts}x{args.generations}"
    else:
        default = "train_" + args.only.replace(",", "_")
    out = Path(args.out_dir) / f"{args.name or default}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    if os.environ.get("OUT"):
        shutil.copy(out, Path(os.environ["OUT"]) / out.name)
    print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()
