"""``python -m bench <subcommand> [args]``: the one entry point of danka's benchmarks.

``python -m bench`` lists the subcommands; ``python -m bench SUB --help`` shows one's
options. A subcommand's module is imported only when it runs, so a benchmark whose module
or optional dependency (TRL, triton, bitsandbytes) is missing does not break the others.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, what it measures)
COMMANDS: dict[str, tuple[str, str]] = {
    "rollout": ("bench.speed.rollout", "rollout tokens/s: danka's fast engine vs HF generate"),
    "train": ("bench.speed.train", "update step, MFU, log-prob head, 7B PPO memory, packing"),
    "vllm": ("bench.speed.vllm_compare", "vLLM vs the fast engine: rollout grid + GRPO step"),
    "trl": ("bench.peers.vs_trl", "GRPO step time and peak memory: TRL's GRPOTrainer vs danka"),
    "trl-learn": ("bench.peers.trl_learn", "GSM8K for N minutes with TRL's GRPOTrainer + LoRA"),
    "decode-attention": ("bench.speed.decode_attention", "decode-attention kernels (CUDA)"),
    "shared-prefix": ("bench.speed.shared_prefix", "shared-prefix prefill and training forward"),
    "small-card": ("bench.memory.small_card", "24/12 GiB card simulated: micro-batch auto, peaks"),
    "plan-check": ("bench.memory.plan_check", "memory plan vs measured peaks: seed, 7B, Qwen 0.5B"),
    "scale": ("bench.speed.scale", "1 vs 2 GPUs: same weights, step throughput"),
    "calc-baseline": ("bench.learning.calc_tool_baseline", "untrained calc accuracy, no tool/tool"),
    "calc-prompt": ("bench.learning.calc_tool_prompt", "untrained valid-call rate per tool prompt"),
    "calc-heldout": ("bench.learning.calc_tool_heldout", "held-out calc accuracy, greedy+sampled"),
    "calc-learning": ("bench.learning.calc_tool_learning", "calc-tool learning run, before/after"),
    "rm-eval": ("bench.learning.rm_eval_pairs", "pairwise accuracy of reward models on pair sets"),
    "rm-tracking": ("bench.learning.rm_tracking", "does an RM track the rule reward in RL?"),
    "gsm8k-floors": ("bench.learning.gsm8k_floors", "GSM8K accuracy of answers that do not reason"),
    "learning": ("bench.learning.learning", "learning runs: held-out accuracy before/after"),
    "gsm8k": ("bench.learning.gsm8k", "GSM8K time-to-accuracy on a real model vs verl's PPO curve"),
    "task-candidates": ("bench.learning.task_candidates", "candidate tasks: base accuracy, floor"),
    "summary": ("bench.summary", "the headline numbers, read back from bench/results/"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m bench <subcommand> [args]   (--help after one for its options)"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown subcommand {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:  # a dependency of the module is missing: say which
            raise
        print(f"{name}: {module_name} is not in this checkout", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
