"""``speed.preflight``: run the worst-case shapes once, so a run that will not fit fails
in its first minute rather than after hours."""

from __future__ import annotations

import torch

from danka.rollout.base import finish_batch
from danka.step.guards import DoesNotFit, OutOfMemory
from danka.step.records import RewardStats, Rollout, Scored
from danka.step.stages import Stages


def worst_case(s: Stages, prompts: list[list[int]]) -> Scored:
    """Scored samples where every response has the full response budget (max_new_tokens;
    with tools, agent.max_total_tokens), with random rewards."""
    n, r, pad = s.sampling.params.n, s.scoring.response_budget, s.sampling.pad_id
    batch = finish_batch(
        prompts,
        [[pad] * r for _ in range(len(prompts) * n)],  # eos_ids=[]: never cut
        n,
        eos_ids=[],
        pad_id=pad,
        max_new_tokens=r,
    )
    if s.algo.correction is not None:  # the engine's log-probs are not run here
        batch.rollout_logprobs = torch.zeros(batch.response_ids.shape)
    rewards = torch.randn(batch.size, generator=torch.Generator().manual_seed(0))
    stats = RewardStats(0.0, {}, 0.0, 0.0, 1.0, float(r), 1.0, None)
    rollout = Rollout(batch=batch, completions=[""] * batch.size, shown=[""] * batch.size)
    valid = torch.ones(batch.size, dtype=torch.bool)
    return Scored(rollout=rollout, rewards=rewards, parts={}, valid=valid, stats=stats)


def preflight(s: Stages, micro: int, log) -> int:
    """One rollout of the longest prompts, then log-probs, values and an update (weights and
    optimizer untouched) on the worst-case batch, at ``micro`` sequences a forward; returns
    the micro-batch the run starts with (an out-of-memory retry may have halved it)."""
    ids = s.prompts.ids
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    idx = order[: s.sampler.batch_size]  # trainer.batch_size prompts
    prompts = [ids[i] for i in idx]
    try:
        s.sample(idx, micro)
        scored = worst_case(s, prompts)
        logp, micro = s.old_and_ref(scored, micro)
        values, micro = s.values(scored, micro)
        prepared = s.advantages(scored, logp, values)
        s.run_update(prepared, micro, dry_run=True, generator=torch.Generator().manual_seed(0))
    except DoesNotFit:
        raise
    except OutOfMemory as err:  # the worst case does not fit: the settings, not a fault
        raise DoesNotFit.because(err, "in the preflight at the worst-case shapes") from None
    peak = ""
    device = next(s.models.policy.parameters()).device
    if device.type == "cuda":
        peak = f": peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
        torch.cuda.reset_peak_memory_stats(device)
    log.info(
        f"preflight passed at the worst-case shapes ({len(prompts)} x "
        f"{s.sampling.params.n} sequences, {max(map(len, prompts))} prompt + "
        f"{s.scoring.response_budget} response tokens){peak}"
    )
    return micro
