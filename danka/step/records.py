"""The typed records one training step hands from stage to stage, and what it returns:

    Rollout -> Scored -> (OldAndRef, values) -> Prepared -> UpdateStats -> StepResult

Each stage takes the record of the stage before and returns its own; nothing is filled in
later, so a stage cannot run on a half-built batch. Shapes: B samples, P prompt tokens
(left-padded), R response tokens (right-padded).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from danka.types import RolloutBatch, map_tensors, to_device


class OnPolicy:
    """Marker for "pi_old is the policy at the update's only optimiser step": the update
    uses its own detached log-probs as pi_old (ratio exactly 1, the right gradient), which
    saves one forward pass. It is a value of ``TrainBatch.old_logprobs``, never None."""

    _instance: OnPolicy | None = None

    def __new__(cls) -> OnPolicy:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ON_POLICY"


ON_POLICY = OnPolicy()


@dataclass
class Rollout:
    """Step 2: the samples, the same type for single-turn and agent sampling."""

    batch: RolloutBatch  # ids and masks (agent: loss_mask 0 on tool / environment tokens)
    completions: list[str]  # (B,) what the rewards read: the response text, or an agent's
    # final answer
    shown: list[Any]  # (B,) what the completions log shows: the text, or an agent's messages
    messages: list[list[dict]] | None = None  # (B,) an agent's messages after the prompt
    # (tool turns included), which rewards may read besides the final answer; None single-turn
    env_rewards: torch.Tensor | None = None  # (B,) an environment's summed step rewards
    agent_stats: dict[str, float] = field(default_factory=dict)  # agent/* (empty single-turn)

    @property
    def size(self) -> int:
        return self.batch.size

    @property
    def generated_tokens(self) -> float:
        return float(self.batch.response_mask.sum())


@dataclass(frozen=True)
class RewardStats:
    """Step 3's numbers: means over the valid samples (a function's over the valid samples
    it applies to)."""

    mean: float  # combined reward
    per_part: dict[str, float]  # reward function (and env / overlong part) -> mean
    error_rate: float  # per (function, sample) call
    not_applicable: float  # share of samples no function applied to
    valid_frac: float
    response_length: float  # mean response tokens
    truncated: float  # share of samples cut at max_new_tokens
    zero_adv_groups: float | None  # share of groups whose rewards are all equal


@dataclass
class Scored:
    """Step 3: the rollout with its rewards. ``valid`` False (a skipped reward, a
    truncated sample under mask_truncated) keeps the sample out of every loss and group
    statistic; masks are never zeroed for it."""

    rollout: Rollout
    rewards: torch.Tensor  # (B,) float, the combined (weighted) score; 0 where invalid
    parts: dict[str, torch.Tensor]  # name -> (B,) unweighted score of each part
    valid: torch.Tensor  # (B,) bool
    stats: RewardStats

    @property
    def batch(self) -> RolloutBatch:
        return self.rollout.batch

    @property
    def train_mask(self) -> torch.Tensor:
        """(B, R) float: the loss mask on valid samples."""
        return self.batch.loss_mask * self.valid.to(self.batch.loss_mask.dtype).unsqueeze(-1)


@dataclass
class OldAndRef:
    """Step 4: the log-probs the loss compares against."""

    old: torch.Tensor | OnPolicy  # (B, R) log pi_old, or ON_POLICY
    ref: torch.Tensor | None  # (B, R) log pi_ref; None when no KL term needs a reference
    is_weights: torch.Tensor | None  # (B, R) rollout-correction weight per token, or None
    valid: torch.Tensor  # (B,) bool: Scored.valid, less what the correction drops
    logprob_gap: float | None  # mean |log pi_rollout - log pi_old| over loss tokens
    correction: dict[str, float] = field(default_factory=dict)  # the correction's metrics


@dataclass
class TrainBatch:
    """What the update reads; every tensor (B, ...) so mini- and micro-batches are row
    selections. Fields that an algorithm does not need are None, never half-filled."""

    prompt_ids: torch.Tensor  # (B, P) long
    prompt_mask: torch.Tensor  # (B, P) long
    response_ids: torch.Tensor  # (B, R) long
    response_mask: torch.Tensor  # (B, R) float
    loss_mask: torch.Tensor  # (B, R) float
    valid: torch.Tensor  # (B,) bool
    advantages: torch.Tensor  # (B, R), 0 off train_mask
    old_logprobs: torch.Tensor | OnPolicy  # (B, R) or ON_POLICY
    rollout_logprobs: torch.Tensor | None = None  # (B, R)
    ref_logprobs: torch.Tensor | None = None  # (B, R), with a KL term in the loss
    is_weights: torch.Tensor | None = None  # (B, R), with a rollout correction
    values: torch.Tensor | None = None  # (B, R) V(s_t) at sampling, with a critic
    returns: torch.Tensor | None = None  # (B, R) critic targets, with a critic

    @classmethod
    def of(cls, rollout: RolloutBatch, **computed: Any) -> TrainBatch:
        """``rollout``'s token ids and masks with what later stages ``computed`` for them
        (``valid``, ``advantages``, ``old_logprobs``, ...)."""
        tokens = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "loss_mask")
        return cls(**{name: getattr(rollout, name) for name in tokens}, **computed)

    @property
    def size(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def train_mask(self) -> torch.Tensor:
        return self.loss_mask * self.valid.to(self.loss_mask.dtype).unsqueeze(-1)

    def select(self, idx: torch.Tensor) -> TrainBatch:
        return map_tensors(self, lambda v: v[idx])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TrainBatch:
        return to_device(self, device, non_blocking)


@dataclass
class Prepared:
    """Steps 4-6: the batch the update trains on, and how it was made."""

    batch: TrainBatch
    old_and_ref: OldAndRef
    kl_in_reward: float | None  # mean KL per token subtracted from the rewards (kl.mode reward)


@dataclass(frozen=True)
class ActorStats:
    """The policy's update, averaged over its optimiser steps. ``loss``, ``pg_loss``,
    ``entropy``, ``kl_loss``, ``kl_token_mean`` and ``logprob_gap`` are normalised by the
    GLOBAL token/sequence counts: under torchrun each rank holds its share of the sum."""

    loss: float
    pg_loss: float
    entropy: float
    grad_norm: float
    kl_loss: float | None  # kl.mode loss only
    kl_token_mean: float | None  # mean KL per trained token, kl.mode loss only
    logprob_gap: float | None  # on-policy: measured in the update's own forward
    policy: dict[str, float]  # the policy loss's own metrics (clipfrac, ratio_mean, ...)


@dataclass(frozen=True)
class CriticStats:
    """The critic's update (``vf_loss`` a global share, as ActorStats.loss)."""

    vf_loss: float
    grad_norm: float
    value: dict[str, float]  # the value loss's own metrics (vf_clipfrac, vpred_mean, ...)


@dataclass(frozen=True)
class UpdateStats:
    """Step 7. ``skipped``: a non-finite loss or gradient dropped the optimiser step."""

    actor: ActorStats | None  # None while only the critic learns (critic_warmup_steps)
    critic: CriticStats | None
    skipped: bool = False
    reason: str = ""  # why it was skipped


@dataclass(frozen=True)
class DynamicStats:
    """Dynamic sampling's rounds for one step."""

    rounds: int
    groups_generated: int
    groups_dropped: int
    groups_kept: int
    filled: float  # kept / batch_size


@dataclass
class StepResult:
    """One training step: its typed stats and the signals the loop acts on."""

    scored: Scored  # the samples logged (the trained ones; the last round if none trained)
    rounds: list[RewardStats]  # every round's reward stats (dynamic sampling: several)
    prepared: Prepared | None  # None when no update ran (nothing to train on)
    update: UpdateStats | None
    dynamic: DynamicStats | None
    seconds: dict[str, float]  # phase -> seconds (rollout, reward, logprobs, ...)
    peaks_gib: dict[str, float]  # phase -> peak CUDA memory (empty on the CPU)
    micro: int  # the micro-batch the step ended at (an out-of-memory retry halves it)
    kl_measured: float | None = None  # the step's KL (same on every rank): adaptive KL reads it

    @property
    def trained(self) -> bool:
        """An update ran (dynamic sampling may find nothing to train on)."""
        return self.update is not None

    @property
    def skipped(self) -> bool:
        return self.update is not None and self.update.skipped

    @property
    def loss(self) -> float:
        """The actor's loss; while only the critic learns, the critic's."""
        u = self.update
        if u is None or u.skipped:
            return float("nan")
        if u.actor is not None:
            return u.actor.loss
        return u.critic.vf_loss if u.critic is not None else float("nan")

    @property
    def finite(self) -> bool:
        """A bad step (counted towards trainer.max_bad_steps): a skipped optimiser step or
        a non-finite loss. A step with nothing to train on is not a fault."""
        if self.update is None:
            return True
        return not self.update.skipped and math.isfinite(self.loss)


def select_rollout(rollout: Rollout, idx: torch.Tensor, group_index: torch.Tensor) -> Rollout:
    """Rows ``idx`` of ``rollout``, their group numbers replaced by ``group_index``."""
    rows = idx.tolist()
    batch = dataclasses.replace(rollout.batch.select(idx), group_index=group_index)
    return Rollout(
        batch=batch,
        completions=[rollout.completions[i] for i in rows],
        shown=[rollout.shown[i] for i in rows],
        messages=None if rollout.messages is None else [rollout.messages[i] for i in rows],
        env_rewards=None if rollout.env_rewards is None else rollout.env_rewards[idx],
        agent_stats=dict(rollout.agent_stats),
    )
