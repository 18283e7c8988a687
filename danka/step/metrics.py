"""The one place a step's typed results become the metrics dict (metrics.jsonl, train.log,
trackers; names listed in docs/metrics.md). Nothing in the loop reads this dict back:
the signals training acts on are fields of ``StepResult``. This builder also decides what
is summed across ranks: values normalised by global token counts (each rank holds its
share) are summed, everything else averaged.
"""

from __future__ import annotations

from danka import distributed as dist
from danka.rewards.names import OWN_METRICS
from danka.step.records import ActorStats, CriticStats, RewardStats, StepResult, UpdateStats


def _reward(r: RewardStats) -> dict[str, float]:
    """The reward's metrics: the parts' means, then danka's own numbers (named in
    danka/rewards/names.py, where labels are checked against them), which nothing
    overwrites."""
    own = {name: getattr(r, name) for name in OWN_METRICS}
    return {
        "reward": r.mean,
        "response_length": r.response_length,
        "response/truncated": r.truncated,
        **{f"reward/{name}": v for name, v in r.per_part.items()},
        **{f"reward/{name}": v for name, v in own.items() if v is not None},
    }


def _actor(a: ActorStats) -> tuple[dict[str, float], dict[str, float]]:
    """(means, shares) of the actor's update."""
    shares = {"actor/loss": a.loss, "actor/pg_loss": a.pg_loss, "actor/entropy": a.entropy}
    if a.kl_loss is not None:
        shares["actor/kl_loss"] = a.kl_loss
        shares["actor/kl_token_mean"] = a.kl_token_mean
    if a.logprob_gap is not None:
        shares["rollout/logprob_gap"] = a.logprob_gap
    means = {"actor/grad_norm": a.grad_norm, **{f"actor/{k}": v for k, v in a.policy.items()}}
    return means, shares


def _critic(c: CriticStats) -> tuple[dict[str, float], dict[str, float]]:
    means = {"critic/grad_norm": c.grad_norm, **{f"critic/{k}": v for k, v in c.value.items()}}
    return means, {"critic/vf_loss": c.vf_loss}


def update_metrics(u: UpdateStats) -> tuple[dict[str, float], dict[str, float]]:
    """(means, shares) of one update: ``skipped_step``, the actor's and the critic's."""
    means: dict[str, float] = {"skipped_step": float(u.skipped)}
    shares: dict[str, float] = {}
    for stats, fn in ((u.actor, _actor), (u.critic, _critic)):
        if stats is not None:
            m, s = fn(stats)
            means.update(m)
            shares.update(s)
    return means, shares


def step_metrics(
    r: StepResult, *, lr: float, kl_coef: float, packing_ratio: float
) -> dict[str, float]:
    """The step's metrics dict (reduced over ranks under torchrun)."""
    means: dict[str, float] = {}
    shares: dict[str, float] = {}
    means.update(r.scored.rollout.agent_stats)
    parts = [_reward(x) for x in r.rounds]  # over everything generated this step
    for key in parts[0]:
        means[key] = sum(p.get(key, 0.0) for p in parts) / len(parts)
    if r.dynamic is not None:
        d = r.dynamic
        means.update(
            {
                "dynamic_sampling/rounds": float(d.rounds),
                "dynamic_sampling/groups_generated": float(d.groups_generated),
                "dynamic_sampling/groups_dropped": float(d.groups_dropped),
                "dynamic_sampling/groups_kept": float(d.groups_kept),
                "dynamic_sampling/filled": d.filled,
            }
        )
    if not r.trained:
        means["dynamic_sampling/skipped_update"] = 1.0
    if r.prepared is not None:
        logp = r.prepared.old_and_ref
        if logp.logprob_gap is not None:
            means["rollout/logprob_gap"] = logp.logprob_gap
        means.update(logp.correction)
        if r.prepared.kl_in_reward is not None:
            means["kl"] = r.prepared.kl_in_reward
    if r.update is not None:
        m, s = update_metrics(r.update)
        means.update(m)
        shares.update(s)
    if r.kl_measured is not None:
        means.setdefault("kl", r.kl_measured)
    means["loss"] = r.loss
    means["lr"] = lr
    means["kl_coef"] = kl_coef
    means["packing/effective_token_ratio"] = packing_ratio
    means.update({f"time/{k}": v for k, v in r.seconds.items()})
    means.update({f"memory/{k}_peak_gib": v for k, v in r.peaks_gib.items()})
    if r.peaks_gib:
        means["memory/peak_gib"] = max(r.peaks_gib.values())
    out = dist.reduce_metrics(means, shares)
    out["throughput/gen_tokens_per_s"] = r.scored.rollout.generated_tokens / max(
        out.get("time/rollout", 0.0), 1e-9
    )
    return out
