"""``trainer.preflight``: run the worst-case shapes once, so a run that will not fit fails
in its first minute rather than after hours."""

from __future__ import annotations

import torch

from danka.rollout.base import finish_batch
from danka.trainer import steps
from danka.trainer.guards import oom_guard
from danka.trainer.run import Run
from danka.trainer.update import update


def preflight(run: Run, log) -> None:
    """One rollout of the longest prompts, then log-probs, values and an update (weights and
    optimizer untouched) on a batch where every response has the full response budget
    (max_new_tokens; with tools, rollout.max_total_tokens)."""
    t = run.cfg.trainer
    order = sorted(range(len(run.train.ids)), key=lambda i: -len(run.train.ids[i]))
    idx = order[: t.batch_size]
    prompts = [run.train.ids[i] for i in idx]
    steps.rollout(run, idx)
    n, r = t.samples_per_prompt, steps.response_budget(run)  # agent: all turns
    batch = finish_batch(
        prompts,
        [[run.pad_id] * r for _ in range(len(prompts) * n)],  # eos_ids=[]: never cut
        n,
        eos_ids=[],
        pad_id=run.pad_id,
        max_new_tokens=r,
    )
    batch.rewards = torch.randn(batch.size, generator=torch.Generator().manual_seed(0))
    if run.algo.correction is not None:  # the engine's log-probs are not run here
        batch.rollout_logprobs = torch.zeros(batch.response_ids.shape)
    steps.logprobs(run, batch)
    steps.values(run, batch)
    steps.advantages(run, batch)
    with oom_guard("update", run):
        update(run, batch, torch.Generator().manual_seed(0), dry_run=True)
    peak = ""
    if run.device.type == "cuda":
        peak = f": peak {torch.cuda.max_memory_allocated(run.device) / 2**30:.2f} GiB"
        torch.cuda.reset_peak_memory_stats(run.device)
    log.info(
        f"preflight passed at the worst-case shapes ({len(prompts)} x {n} sequences, "
        f"{max(map(len, prompts))} prompt + {r} response tokens){peak}"
    )
