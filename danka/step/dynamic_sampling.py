"""DAPO's dynamic sampling: which groups of a step are worth training on.

Dynamic sampling (DAPO, Yu et al. 2025, https://arxiv.org/abs/2503.14476, section 3.2;
verl's ``algorithm.filter_groups``): a group whose samples all got the same reward has
zero group-relative advantage and teaches nothing, so it is dropped, and more prompts are
generated until the step has ``batch_size`` informative groups. verl raises once
``max_num_gen_batches`` rounds are used; here the step then trains on the informative
groups it has (fewer than ``batch_size``; with none at all the update is skipped). Surplus
groups of the last round are dropped, as in verl. The rounds themselves are a plain loop
in ``danka/step/train_step.py``; this module holds the pieces it uses.

Shapes follow :class:`~danka.types.RolloutBatch`: B samples, P prompt tokens (LEFT
padded), R response tokens (right padded); ``group_index`` (B,) numbers a batch's groups
0..G-1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from danka.step.records import DynamicStats, RewardStats, Scored, select_rollout
from danka.types import RolloutBatch

LEFT_PADDED = frozenset({"prompt_ids", "prompt_mask"})  # (B, P): padding on the left
PADDED_WITH_ID = frozenset({"prompt_ids", "response_ids"})  # padded with the pad id, else 0


def informative_groups(
    rewards: torch.Tensor, group_index: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """(G,) bool: group g has at least two valid samples whose rewards differ.

    ``rewards`` (B,) float, ``group_index`` (B,) long in 0..G-1, ``valid`` (B,) bool or None
    (all valid). "Differ" is exact inequality (verl: std > 0).
    """
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    ok = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    out = torch.zeros(n_groups, dtype=torch.bool)
    for g in range(n_groups):
        r = rewards[(group_index == g) & ok]
        out[g] = r.numel() >= 2 and bool((r != r[0]).any())
    return out


def select_groups(scored: Scored, groups: list[int]) -> Scored:
    """The samples of ``groups`` (in that order), their ``group_index`` renumbered 0..k-1."""
    gi = scored.batch.group_index
    parts = [torch.nonzero(gi == g).flatten() for g in groups]
    idx = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    new_index = (
        torch.cat([torch.full((len(p),), k, dtype=torch.long) for k, p in enumerate(parts)])
        if parts
        else torch.zeros(0, dtype=torch.long)
    )
    return Scored(
        rollout=select_rollout(scored.rollout, idx, new_index),
        rewards=scored.rewards[idx],
        parts={k: v[idx] for k, v in scored.parts.items()},
        valid=scored.valid[idx],
        stats=scored.stats,
    )


def _pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    fill = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch of all samples, in order; groups renumbered so they stay distinct.

    2-D tensor fields are padded to the widest batch: ``prompt_*`` on the left, the rest on
    the right; ids with ``pad_id``, masks / log-probs with 0. A field that is None in every
    batch stays None; None in only some is a ValueError.
    """
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(batches[0]):
        values = [getattr(b, f.name) for b in batches]
        if all(v is None for v in values):
            continue
        if any(v is None for v in values):
            raise ValueError(f"field {f.name!r} is None in some batches only")
        if values[0].dim() == 2:
            width = max(v.shape[1] for v in values)
            fill = pad_id if f.name in PADDED_WITH_ID else 0
            values = [_pad_to(v, width, fill, f.name in LEFT_PADDED) for v in values]
        changes[f.name] = torch.cat(values)
    offsets, total = [], 0
    for b in batches:
        offsets.append(total)
        total += int(b.group_index.max()) + 1 if b.group_index.numel() else 0
    changes["group_index"] = torch.cat([b.group_index + o for b, o in zip(batches, offsets)])
    return dataclasses.replace(batches[0], **changes)


def concat_scored(kept: list[Scored], pad_id: int, stats: RewardStats) -> Scored:
    """The kept groups of every round as one ``Scored`` (``stats``: over all rounds)."""
    first = kept[0].rollout
    env = None if first.env_rewards is None else torch.cat([s.rollout.env_rewards for s in kept])
    rollout = dataclasses.replace(
        first,
        batch=concat_batches([s.batch for s in kept], pad_id),
        completions=[c for s in kept for c in s.rollout.completions],
        shown=[c for s in kept for c in s.rollout.shown],
        messages=None if first.messages is None else [m for s in kept for m in s.rollout.messages],
        env_rewards=env,
    )
    return Scored(
        rollout=rollout,
        rewards=torch.cat([s.rewards for s in kept]),
        parts={k: torch.cat([s.parts[k] for s in kept]) for k in kept[0].parts},
        valid=torch.cat([s.valid for s in kept]),
        stats=stats,
    )


def mean_stats(rounds: list[RewardStats]) -> RewardStats:
    """The reward statistics of a step with several sampling rounds: each number averaged
    over the rounds (a part a round lacks counts 0 there)."""
    if len(rounds) == 1:
        return rounds[0]
    n = len(rounds)
    names = [k for r in rounds for k in r.per_part]
    zero_adv = [r.zero_adv_groups for r in rounds if r.zero_adv_groups is not None]

    def avg(field: str) -> float:
        return sum(getattr(r, field) for r in rounds) / n

    return RewardStats(
        mean=avg("mean"),
        per_part={k: sum(r.per_part.get(k, 0.0) for r in rounds) / n for k in dict.fromkeys(names)},
        error_rate=avg("error_rate"),
        not_applicable=avg("not_applicable"),
        valid_frac=avg("valid_frac"),
        response_length=avg("response_length"),
        truncated=avg("truncated"),
        zero_adv_groups=sum(zero_adv) / len(zero_adv) if zero_adv else None,
    )


class DynamicSampler:
    """The round cap and running totals of dynamic sampling (checkpointed: the totals are
    :meth:`state_dict`; the prompt position lives in the prompt sampler)."""

    def __init__(self, batch_size: int, max_rounds: int, pad_id: int):
        if batch_size < 1 or max_rounds < 1:
            raise ValueError(f"batch_size ({batch_size}) and max_rounds ({max_rounds}) >= 1")
        self.batch_size, self.max_rounds, self.pad_id = batch_size, max_rounds, pad_id
        self.total_rounds = self.total_dropped = self.total_generated = 0

    def keep(self, scored: Scored, have: int) -> tuple[Scored | None, int]:
        """The informative groups of one round, at most ``batch_size - have`` of them (None
        when there is none), and how many groups of the round were informative."""
        good = informative_groups(scored.rewards, scored.batch.group_index, scored.valid)
        take = torch.nonzero(good).flatten().tolist()[: self.batch_size - have]
        return (select_groups(scored, take) if take else None), int(good.sum())

    def record(self, rounds: int, generated: int, informative: int, kept: int) -> DynamicStats:
        """One step's rounds: ``generated`` groups, ``informative`` of them, ``kept``."""
        self.total_rounds += rounds
        self.total_dropped += generated - informative
        self.total_generated += generated
        return DynamicStats(
            rounds=rounds,
            groups_generated=generated,
            groups_dropped=generated - informative,
            groups_kept=kept,
            filled=kept / self.batch_size,
        )

    def state_dict(self) -> dict[str, int]:
        return {
            "total_rounds": self.total_rounds,
            "total_dropped": self.total_dropped,
            "total_generated": self.total_generated,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total_rounds = int(state["total_rounds"])
        self.total_dropped = int(state["total_dropped"])
        self.total_generated = int(state["total_generated"])
