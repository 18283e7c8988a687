"""``speed.preflight``: run the worst-case shapes once, so a run that will not fit fails
in its first minute rather than after hours."""

from __future__ import annotations

import torch

from danka.rollout.base import finish_batch
from danka.trainer.guards import DoesNotFit, OutOfMemory
from danka.trainer.records import RewardStats, Rollout, Scored
from danka.trainer.run import Run
from danka.trainer.stages import Stages, response_budget


def worst_case(run: Run, prompts: list[list[int]]) -> Scored:
    """Scored samples where every response has the full response budget (max_new_tokens;
    with tools, agent.max_total_tokens), with random rewards."""
    n, r = run.cfg.trainer.samples_per_prompt, response_budget(run)
    batch = finish_batch(
        prompts,
        [[run.pad_id] * r for _ in range(len(prompts) * n)],  # eos_ids=[]: never cut
        n,
        eos_ids=[],
        pad_id=run.pad_id,
        max_new_tokens=r,
    )
    if run.algo.correction is not None:  # the engine's log-probs are not run here
        batch.rollout_logprobs = torch.zeros(batch.response_ids.shape)
    rewards = torch.randn(batch.size, generator=torch.Generator().manual_seed(0))
    stats = RewardStats(0.0, {}, 0.0, 0.0, 1.0, float(r), 1.0, None)
    rollout = Rollout(batch=batch, completions=[""] * batch.size, shown=[""] * batch.size)
    valid = torch.ones(batch.size, dtype=torch.bool)
    return Scored(rollout=rollout, rewards=rewards, parts={}, valid=valid, stats=stats)


def preflight(run: Run, s: Stages, log) -> None:
    """One rollout of the longest prompts, then log-probs, values and an update (weights and
    optimizer untouched) on the worst-case batch."""
    t = run.cfg.trainer
    order = sorted(range(len(run.train.ids)), key=lambda i: -len(run.train.ids[i]))
    idx = order[: t.batch_size]
    prompts = [run.train.ids[i] for i in idx]
    try:
        s.sample(idx)
        scored = worst_case(run, prompts)
        logp = s.old_and_ref(scored)
        prepared = s.advantages(scored, logp, s.values(scored))
        s.run_update(prepared, dry_run=True, generator=torch.Generator().manual_seed(0))
    except DoesNotFit:
        raise
    except OutOfMemory as err:  # the worst case does not fit: the settings, not a fault
        raise DoesNotFit.because(err, "in the preflight at the worst-case shapes") from None
    peak = ""
    if run.device.type == "cuda":
        peak = f": peak {torch.cuda.max_memory_allocated(run.device) / 2**30:.2f} GiB"
        torch.cuda.reset_peak_memory_stats(run.device)
    log.info(
        f"preflight passed at the worst-case shapes ({len(prompts)} x "
        f"{t.samples_per_prompt} sequences, {max(map(len, prompts))} prompt + "
        f"{response_budget(run)} response tokens){peak}"
    )
