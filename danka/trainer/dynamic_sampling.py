"""Which samples of a step train: DAPO's dynamic sampling and masking truncated samples.

Dynamic sampling (DAPO, Yu et al. 2025, https://arxiv.org/abs/2503.14476, section 3.2;
verl's ``algorithm.filter_groups``): a group whose samples all got the same reward has
zero group-relative advantage and teaches nothing, so it is dropped, and more prompts are
generated until the step has ``batch_size`` informative groups. verl raises once
``max_num_gen_batches`` rounds are used; here the step then trains on the informative
groups it has (fewer than ``batch_size``; :meth:`DynamicSampler.collect` returns None when
there are none, and the caller skips the update). Surplus groups of the last round are
dropped, as in verl.

Truncated masking (TRL's ``mask_truncated_completions``): a sample that hit
``max_new_tokens`` before EOS is excluded from the loss, since its reward judges an
unfinished answer.

Shapes follow :class:`~danka.types.RolloutBatch`: B samples, P prompt tokens (LEFT
padded), R response tokens (right padded); ``group_index`` (B,) numbers a batch's groups
0..G-1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

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


def select_groups(batch: RolloutBatch, groups: list[int]) -> RolloutBatch:
    """The samples of ``groups`` (in that order), their ``group_index`` renumbered 0..k-1."""
    parts = [torch.nonzero(batch.group_index == g).flatten() for g in groups]
    idx = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    out = _map_rows(batch, idx)
    new_index = torch.cat(
        [torch.full((len(p),), k, dtype=torch.long) for k, p in enumerate(parts)]
    ) if parts else torch.zeros(0, dtype=torch.long)  # fmt: skip
    return dataclasses.replace(out, group_index=new_index)


def _map_rows(batch: RolloutBatch, idx: torch.Tensor) -> RolloutBatch:
    """Rows ``idx`` of every per-sample field (tensors, dicts of tensors or lists, lists)."""
    changes = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = value[idx]
        elif isinstance(value, dict):
            changes[f.name] = {k: _rows(v, idx) for k, v in value.items()}
        elif isinstance(value, list):
            changes[f.name] = _rows(value, idx)
    return dataclasses.replace(batch, **changes)


def _rows(value: Any, idx: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor):
        return value[idx]
    return [value[i] for i in idx.tolist()]


def _pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    fill = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch of all samples, in order; groups renumbered so they stay distinct.

    2-D tensor fields are padded to the widest batch: ``prompt_*`` on the left, the rest on
    the right; ids with ``pad_id``, masks / log-probs / values with 0. A field that is None
    in every batch stays None; None in only some is a ValueError. dict fields (e.g.
    ``reward_parts``) are joined key by key, list fields concatenated.
    """
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    first = batches[0]
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        values = [getattr(b, f.name) for b in batches]
        if all(v is None for v in values):
            continue
        if any(v is None for v in values):
            raise ValueError(f"field {f.name!r} is None in some batches only")
        changes[f.name] = _concat_field(f.name, values, pad_id)
    offsets, total = [], 0
    for b in batches:
        offsets.append(total)
        total += int(b.group_index.max()) + 1 if b.group_index.numel() else 0
    changes["group_index"] = torch.cat([b.group_index + o for b, o in zip(batches, offsets)])
    return dataclasses.replace(first, **changes)


def _concat_field(name: str, values: list, pad_id: int) -> Any:
    v0 = values[0]
    if isinstance(v0, torch.Tensor):
        if v0.dim() == 2:
            width = max(v.shape[1] for v in values)
            fill = pad_id if name in PADDED_WITH_ID else 0
            values = [_pad_to(v, width, fill, name in LEFT_PADDED) for v in values]
        return torch.cat(values)
    if isinstance(v0, dict):
        return {k: _concat_field(k, [v[k] for v in values], pad_id) for k in v0}
    if isinstance(v0, list):
        return [x for v in values for x in v]
    return v0  # a per-batch constant (e.g. a step number): the first batch's


class DynamicSampler:
    """Generate until ``batch_size`` informative groups (or ``max_rounds`` rounds).

    ``collect(next_prompts, rollout)`` calls ``prompts = next_prompts()`` (one round's
    prompts, e.g. ``PromptSampler.next_batch``) and ``rollout(prompts)`` (generate AND score:
    a RolloutBatch with ``rewards`` set) up to ``max_rounds`` times. The prompt position
    lives in the caller's prompt sampler, which advances once per round: checkpoint it after
    the step and a resumed run continues with the same prompts. This object's own state
    (running totals for the logs) is :meth:`state_dict`.
    """

    def __init__(self, batch_size: int, max_rounds: int, pad_id: int):
        if batch_size < 1 or max_rounds < 1:
            raise ValueError(f"batch_size ({batch_size}) and max_rounds ({max_rounds}) >= 1")
        self.batch_size, self.max_rounds, self.pad_id = batch_size, max_rounds, pad_id
        self.total_rounds = self.total_dropped = self.total_generated = 0

    def collect(
        self, next_prompts: Callable[[], Any], rollout: Callable[[Any], RolloutBatch]
    ) -> tuple[RolloutBatch | None, dict[str, float]]:
        """``(batch, metrics)``: the first ``batch_size`` informative groups (fewer at the
        round cap, None if none), group_index 0..k-1; never a group of equal rewards.

        metrics: ``dynamic_sampling/rounds``, ``groups_generated``, ``groups_dropped``
        (all-equal rewards), ``groups_kept``, ``filled`` (kept / batch_size).
        """
        kept: list[RolloutBatch] = []
        n_kept = n_generated = n_dropped = rounds = 0
        while n_kept < self.batch_size and rounds < self.max_rounds:
            batch = rollout(next_prompts())
            rounds += 1
            if batch.rewards is None:
                raise ValueError("rollout() must return a scored batch (rewards set)")
            good = informative_groups(
                batch.rewards, batch.group_index, getattr(batch, "valid", None)
            )
            n_generated += len(good)
            n_dropped += int((~good).sum())
            take = torch.nonzero(good).flatten().tolist()[: self.batch_size - n_kept]
            if take:
                kept.append(select_groups(batch, take))
                n_kept += len(take)
        self.total_rounds += rounds
        self.total_dropped += n_dropped
        self.total_generated += n_generated
        metrics = {
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/groups_generated": float(n_generated),
            "dynamic_sampling/groups_dropped": float(n_dropped),
            "dynamic_sampling/groups_kept": float(n_kept),
            "dynamic_sampling/filled": n_kept / self.batch_size,
        }
        return (concat_batches(kept, self.pad_id) if kept else None), metrics

    def state_dict(self) -> dict[str, int]:
        return {"total_rounds": self.total_rounds, "total_dropped": self.total_dropped,
                "total_generated": self.total_generated}  # fmt: skip

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total_rounds = int(state["total_rounds"])
        self.total_dropped = int(state["total_dropped"])
        self.total_generated = int(state["total_generated"])


def mask_truncated_samples(
    truncated: torch.Tensor, loss_mask: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_mask, valid)`` with truncated samples switched off: their loss-mask rows are
    0 and they are invalid. ``truncated`` (B,) bool, ``loss_mask`` (B, R), ``valid`` (B,)
    bool or None (all valid). Inputs are not modified."""
    keep = ~truncated.bool()
    new_mask = loss_mask * keep.unsqueeze(1).to(loss_mask.dtype)
    new_valid = keep if valid is None else valid.bool() & keep
    return new_mask, new_valid


def mask_truncated(batch: RolloutBatch) -> RolloutBatch:
    """``trainer.mask_truncated``: a copy of ``batch`` whose ``loss_mask`` and ``valid``
    exclude truncated samples (the batch must carry those fields; a None ``loss_mask``
    starts from ``response_mask``)."""
    loss_mask = getattr(batch, "loss_mask", None)
    if not hasattr(batch, "loss_mask") or not hasattr(batch, "valid"):
        raise TypeError("mask_truncated needs a RolloutBatch with loss_mask and valid fields")
    if loss_mask is None:
        loss_mask = batch.response_mask
    new_mask, new_valid = mask_truncated_samples(batch.truncated, loss_mask, batch.valid)
    return dataclasses.replace(batch, loss_mask=new_mask, valid=new_valid)
