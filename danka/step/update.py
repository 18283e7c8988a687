"""Step 7, the PPO-style update: epochs over mini-batches, gradient accumulation over
micro-batches.

Each mini-batch is one optimiser step. Its loss is normalised by the mini-batch's global
token/sequence counts (``LossNorm``, over ``train_mask``: loss tokens of valid samples), so
summing micro-batch losses gives the same loss and gradient whatever the micro-batch size.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from danka import distributed as dist
from danka.algorithms.losses import LossNorm, PolicyLossInput, aggregate, value_loss
from danka.models import body_graphs
from danka.step.algorithm import Algorithm
from danka.step.forward import (
    ForwardSettings,
    critic_values,
    graph_session,
    micro_batch_indices,
    policy_logprobs,
    trim,
)
from danka.step.model_set import ModelSet
from danka.step.records import ActorStats, CriticStats, OnPolicy, TrainBatch, UpdateStats


class NonFiniteError(RuntimeError):
    """The loss or the gradient was NaN/inf; the optimiser step was skipped."""


@dataclass(frozen=True)
class UpdateSettings:
    """What the update reads besides the models, optimisers and the algorithm (every
    value from the validated config: the schema holds the defaults, not this class)."""

    forward: ForwardSettings
    ppo_epochs: int
    mini_batch_seqs: int  # sequences per optimiser step on this rank
    max_response_length: int  # trainer.max_new_tokens, the seq-mean-token-sum-norm divisor
    loss_agg_mode: str  # loss.agg_mode
    entropy_coef: float  # loss.entropy_coef
    vf_coef: float  # loss.vf_coef (critic loss weight)
    value_clip: float  # loss.value_clip
    max_grad_norm: float  # optim.max_grad_norm


@dataclass
class Optimizers:
    actor: torch.optim.Optimizer
    actor_sched: torch.optim.lr_scheduler.LRScheduler
    critic: torch.optim.Optimizer | None = None
    critic_sched: torch.optim.lr_scheduler.LRScheduler | None = None

    def zero_grad(self) -> None:
        self.actor.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.zero_grad(set_to_none=True)

    def step_schedules(self) -> None:
        """The schedules follow the step number, with or without an optimiser step."""
        self.actor_sched.step()
        if self.critic_sched is not None:
            self.critic_sched.step()


def _checked_loss(losses: list[torch.Tensor], opt, what: str) -> torch.Tensor:
    """The mini-batch's loss (the sum of its micro-batch losses, a device tensor) after
    checking it: a NaN/inf loss on ANY rank drops the gradients and raises on every rank
    (one collective), so all ranks skip the same optimiser step. Checked once per
    mini-batch, not per micro-batch, so the micro-batch loop never waits for the GPU; a
    non-finite micro-batch only poisons gradients that are dropped here. Gradients a CUDA
    graph accumulated (``speed.cuda_graphs``) reach ``.grad`` first."""
    body_graphs.flush()
    stacked = torch.stack(losses)
    if dist.all_finite(stacked):
        return stacked.sum()
    opt.zero_grad(set_to_none=True)
    bad = stacked[~torch.isfinite(stacked)]
    here = float(bad[0]) if bad.numel() else float(stacked.sum())
    elsewhere = " (non-finite on another rank)" if math.isfinite(here) else ""
    raise NonFiniteError(f"{what} loss is {here}{elsewhere}")


def host_metrics(metrics: dict, steps: int) -> dict[str, float]:
    """The update's summed values / ``steps`` as floats; device tensors are read in ONE
    transfer (the micro-batch loop keeps them on the device: no host sync per micro-batch)."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) / steps for k, v in metrics.items() if k not in keys}
    if keys:
        device = metrics[keys[0]].device
        values = torch.stack([metrics[k].detach().float().reshape(()).to(device) for k in keys])
        out.update({k: v / steps for k, v in zip(keys, values.tolist())})
    return out


def loss_norm(mini: TrainBatch, max_response_length: int) -> LossNorm:
    """Counts of the mini-batch's trained tokens and sequences (global over ranks)."""
    # global counts (one collective): each rank's loss is its share of the global loss
    tokens, seqs = dist.all_sum_many([mini.train_mask.sum(), mini.valid.sum()])
    return LossNorm(
        num_tokens=max(tokens, 1.0), num_seqs=seqs, max_response_length=max_response_length
    )


def _step(optimizer, params, max_grad_norm: float, dry_run: bool = False) -> float:
    """Clip and step; a non-finite gradient skips the step (and is reported).
    ``dry_run`` (the preflight) measures everything but leaves weights and optimizer alone."""
    if dist.is_active():  # gradients become sums over ranks
        dist.sync_grads(params)
    # the global norm (same on every rank, so all skip together), clipped when
    # max_grad_norm > 0; params may mix sharded (DTensor) and replicated tensors
    grad_norm = dist.clip_grad_norm(params, max_grad_norm)
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"gradient norm is {grad_norm}")
    if not dry_run:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def _micro_batches(mini: TrainBatch, micro_size: int, device: torch.device, s: UpdateSettings):
    """(micro-batch on ``device``, its share of the mini-batch's trained tokens here)."""
    lengths = mini.prompt_mask.sum(1) + mini.response_mask.sum(1)
    tokens = float(mini.train_mask.sum())
    for idx in micro_batch_indices(lengths, micro_size, s.forward):
        mb = trim(mini.select(idx)).to(device, non_blocking=True)
        # the losses' own metrics are masked means over one micro-batch: weighted by its
        # trained tokens they add up to the mini-batch's mean (a micro-batch with no
        # trained token, e.g. all truncated under mask_truncated, weighs 0, not 1/k)
        share = float(mini.train_mask[idx].sum()) / tokens if tokens else 0.0
        yield mb, share


def actor_minibatch(
    models: ModelSet,
    algo: Algorithm,
    opt: torch.optim.Optimizer,
    mini: TrainBatch,
    s: UpdateSettings,
    micro_size: int,
    kl_coef: float,
    sums: dict,
    dry_run: bool = False,
) -> None:
    """One optimiser step of the policy on ``mini``, its values added into ``sums``:
    loss = policy loss (x rollout-correction weights) - entropy_coef * entropy
           + kl_coef * KL(pi || pi_ref)   (kl.mode: loss)."""
    norm = loss_norm(mini, s.max_response_length)
    kl_in_loss = algo.kl_mode is not None and algo.kl_mode.in_loss
    device = next(models.policy.parameters()).device
    losses: list[torch.Tensor] = []
    for mb, share in _micro_batches(mini, micro_size, device, s):
        mask = mb.train_mask
        with models.actor():
            logprobs, entropy = policy_logprobs(
                models.policy, mb, settings=s.forward, with_entropy=True
            )
        if isinstance(mb.old_logprobs, OnPolicy):  # ratio 1 with the right gradient
            old = logprobs.detach()
            if mb.rollout_logprobs is not None:
                gap = ((mb.rollout_logprobs - old).abs() * mb.loss_mask).sum()
                sums["logprob_gap"] += gap / norm.num_tokens
        else:
            old = mb.old_logprobs
        # a non-negative per-token weight w folds into the advantage: w * L(A) = L(w * A)
        # for the clipped surrogate (max of two terms linear in A) and its dual clip
        adv = mb.advantages if mb.is_weights is None else mb.advantages * mb.is_weights
        pg_loss, parts = algo.policy_loss(
            PolicyLossInput(logprobs, old, adv, mask), algo.loss_params, norm
        )
        ent = aggregate(entropy, mask, s.loss_agg_mode, norm)
        loss = pg_loss - s.entropy_coef * ent if s.entropy_coef else pg_loss
        if kl_in_loss:
            kl = algo.kl_estimator(logprobs, mb.ref_logprobs)
            kl_loss = aggregate(kl, mask, s.loss_agg_mode, norm)
            loss = loss + kl_coef * kl_loss
            sums["kl_loss"] += kl_loss.detach()
            # the adaptive controller's quantity: mean KL per trained token
            sums["kl_token_mean"] += (kl.detach() * mask).sum() / norm.num_tokens
        _backward(loss, losses, sums, parts, share)
        # the norm makes micro-batch values add up to the mini-batch value
        sums["pg_loss"] += pg_loss.detach()
        sums["entropy"] += ent.detach()
    sums["total"] += _checked_loss(losses, opt, "policy")
    sums["grad_norm"] += _step(opt, models.actor_params, s.max_grad_norm, dry_run)


def _backward(loss: torch.Tensor, losses: list, sums: dict, parts: dict, share: float) -> None:
    """Backward of one micro-batch's loss (kept in ``losses``); its per-token metrics
    (weighted by the micro-batch's ``share`` of the trained tokens) are summed as device
    tensors under ``part/<name>``. Every rank runs every backward (FSDP2's reduce-scatters
    stay matched); non-finite losses are handled once per mini-batch by
    :func:`_checked_loss`."""
    loss.backward()
    losses.append(loss.detach())
    for key, value in parts.items():
        sums[f"part/{key}"] += value * share


def critic_minibatch(
    models: ModelSet,
    opt: torch.optim.Optimizer,
    mini: TrainBatch,
    s: UpdateSettings,
    micro_size: int,
    sums: dict,
    dry_run: bool = False,
) -> None:
    """One optimiser step of the critic: clipped value loss towards ``returns``."""
    norm = loss_norm(mini, s.max_response_length)
    device = next(models.policy.parameters()).device
    losses: list[torch.Tensor] = []
    for mb, share in _micro_batches(mini, micro_size, device, s):
        with models.critic():
            v = critic_values(
                models.critic_model, mb, value_head=models.value_head, settings=s.forward
            )
        loss, parts = value_loss(v, mb.values, mb.returns, mb.train_mask, s.value_clip, norm)
        _backward(s.vf_coef * loss, losses, sums, parts, share)
    sums["total"] += _checked_loss(losses, opt, "value")
    sums["grad_norm"] += _step(opt, models.critic_params, s.max_grad_norm, dry_run)


def _parts(values: dict[str, float]) -> dict[str, float]:
    return {k.removeprefix("part/"): v for k, v in values.items() if k.startswith("part/")}


def _actor_stats(v: dict[str, float]) -> ActorStats:
    return ActorStats(
        loss=v["total"],
        pg_loss=v["pg_loss"],
        entropy=v["entropy"],
        grad_norm=v["grad_norm"],
        kl_loss=v.get("kl_loss"),
        kl_token_mean=v.get("kl_token_mean"),
        logprob_gap=v.get("logprob_gap"),
        policy=_parts(v),
    )


def update(
    models: ModelSet,
    algo: Algorithm,
    opts: Optimizers,
    batch: TrainBatch,
    s: UpdateSettings,
    *,
    micro_size: int,
    kl_coef: float,
    generator: torch.Generator,
    train_actor: bool = True,
    dry_run: bool = False,
) -> UpdateStats:
    """``ppo_epochs`` passes over the batch in mini-batches; returns the stats averaged
    over the optimiser steps. Raises NonFiniteError (after skipping the step) on NaN/inf.
    ``train_actor=False`` updates only the critic (trainer.critic_warmup_steps)."""
    actor_sums: dict = defaultdict(float)
    critic_sums: dict = defaultdict(float)
    steps = 0
    with graph_session(s.forward, micro_size, models.policy):
        for _ in range(s.ppo_epochs):
            shuffle = s.ppo_epochs > 1 or s.mini_batch_seqs < batch.size
            order = torch.randperm(batch.size, generator=generator) if shuffle else None
            order = torch.arange(batch.size) if order is None else order
            for start in range(0, batch.size, s.mini_batch_seqs):
                mini = batch.select(order[start : start + s.mini_batch_seqs])
                if train_actor:
                    actor_minibatch(
                        models, algo, opts.actor, mini, s, micro_size, kl_coef, actor_sums, dry_run
                    )
                if models.value_head is not None:
                    critic_minibatch(models, opts.critic, mini, s, micro_size, critic_sums, dry_run)
                steps += 1
    actor = _actor_stats(host_metrics(actor_sums, steps)) if train_actor else None
    critic = None
    if models.value_head is not None:
        v = host_metrics(critic_sums, steps)
        critic = CriticStats(vf_loss=v["total"], grad_norm=v["grad_norm"], value=_parts(v))
    return UpdateStats(actor=actor, critic=critic)
