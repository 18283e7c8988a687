"""Each package of danka has a line budget (lines of its ``.py`` files, blank lines and
comments included), beside the layering test: code may grow, but past a budget only as a
decision. The lines are counted as ``ruff format`` writes them: ``# fmt: skip`` (which
squeezed code under the old budgets) is not allowed in the package. Each number is the
package's formatted size when it was set plus about 8% headroom, with what the package
holds beside it; raise one in the same commit as the growth and say why in its message,
lower it when a package shrinks for good."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "danka"

# package (or "danka" for the top-level modules) -> lines allowed (formatted size, 2026-12-07)
BUDGET = {
    "danka": 3150,  # 2913: CLI, API, bounded reads, number limits, signals, lifecycle, io, hub
    "agent": 2300,  # 2126: the multi-turn loop, tools in sandboxed workers, environments
    "algorithms": 1100,  # 974: advantage estimators, policy losses, KL, rollout correction
    "checkpoint": 1100,  # 1013: the crash-safe commit protocol, verification, retention
    "config": 1450,  # 1317: loading (YAML + overrides, located errors), per-section checks
    "data": 2250,  # 2055: row formats, templates, splits, tasks, packing, prompt format
    "diagnose": 1600,  # 1447: the run doctor's checks over metrics and completions
    "distributed": 850,  # 767: torch.distributed ranks, FSDP sharding, agreed decisions
    "logging": 950,  # 873: train.log, metrics.jsonl, console, trackers
    "models": 3450,  # 3207: loading (hub, folder, GGUF), LoRA, value head, chunked
    # log-probs, padding-free attention, FLOPs, CPU threads and OpenMP waits; raised from
    # 2900 (2026-12-07) for the fused LoRA layer (lora_linear.py, one autograd function per
    # adapted linear) and the per-layer compile of speed.compile, both the update's speed;
    # from 3150 (2026-12-07) for body_graphs.py (265: CUDA graphs of the training body, the
    # answer to an update bound by launching kernels from Python)
    "planning": 1550,  # 1412: the memory plan per phase, engine choice, known shapes, and
    # the whole start-up plan in one call (run_plan: budget, shape, engine, sizes)
    "rewards": 1700,  # 1545: rule rewards, user functions in workers, reward models
    "schema": 920,  # 840: the config's typed sections with help text, dtypes, secrets, units
    "rm": 550,  # 494: reward-model training (Bradley-Terry)
    "rollout": 4250,  # 3963: HF generate, the fast engine and its Triton kernels, vLLM
    "step": 3050,  # 2810: one training step: stages, records, forwards, update, evaluation
    "tools": 4150,  # 3841: generate, chat, eval, plot and report, export, estimate, push
    "trainer": 1800,  # 1625: the run around the step: build, fit, outputs, saves, resume
    "usercode": 900,  # 832: running the user's code: workers, contracts, the kill guardian
}


def lines_per_package(package: Path = PACKAGE) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in package.rglob("*.py"):
        rel = path.relative_to(package)
        key = rel.parts[0] if len(rel.parts) > 1 else "danka"
        counts[key] = counts.get(key, 0) + len(path.read_text(encoding="utf-8").splitlines())
    return counts


def test_every_package_has_a_budget():
    assert sorted(lines_per_package()) == sorted(BUDGET)


def test_no_package_is_over_its_budget():
    over = {k: (n, BUDGET[k]) for k, n in lines_per_package().items() if n > BUDGET.get(k, 0)}
    assert not over, "over budget (lines, budget): " + ", ".join(
        f"{k} {n} > {b}" for k, (n, b) in sorted(over.items())
    )


def test_the_count_reads_every_line(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n\n# why\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "b.py").write_text("y = 2\n")
    assert lines_per_package(tmp_path) == {"danka": 3, "pkg": 1}


def test_no_fmt_skip_squeezes_code_under_a_budget():
    """The budgets count formatted code: a ``# fmt: skip`` line would not be."""
    skips = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "# fmt: skip" in line
    ]
    assert not skips, "format these as ruff does: " + ", ".join(skips)
