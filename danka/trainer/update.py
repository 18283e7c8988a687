"""The PPO-style update: epochs over mini-batches, gradient accumulation over micro-batches.

Each mini-batch is one optimiser step. Its loss is normalised by the mini-batch's global
token/sequence counts (``LossNorm``), so summing micro-batch losses gives the same loss
and gradient whatever the micro-batch size.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from danka import distributed as dist
from danka.algorithms.kl import KL_ESTIMATORS
from danka.algorithms.losses import POLICY_LOSSES, LossNorm, PolicyLossParams, aggregate, value_loss
from danka.trainer.forward import critic_values, micro_batch_indices, policy_logprobs, trim
from danka.types import RolloutBatch


class NonFiniteError(RuntimeError):
    """The loss or the gradient was NaN/inf; the optimiser step was skipped."""


def _norm(mini: RolloutBatch, max_response_length: int) -> LossNorm:
    if dist.is_active():  # global counts: each rank's loss is its share of the global loss
        return LossNorm(
            num_tokens=max(dist.all_sum(float(mini.response_mask.sum())), 1.0),
            num_seqs=dist.all_sum(float(mini.size)),
            max_response_length=max_response_length,
        )
    return LossNorm(
        num_tokens=float(mini.response_mask.sum().clamp(min=1.0)),
        num_seqs=float(mini.size),
        max_response_length=max_response_length,
    )


def _step(optimizer, params, max_grad_norm: float, dry_run: bool = False) -> float:
    """Clip and step; a non-finite gradient skips the step (and is reported).
    ``dry_run`` (the preflight) measures everything but leaves weights and optimizer alone."""
    if dist.is_active():  # gradients become sums over ranks
        dist.sync_grads(params)
    if max_grad_norm > 0:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    else:
        grads = [p.grad.norm() for p in params if p.grad is not None]
        grad_norm = float(torch.stack(grads).norm()) if grads else 0.0
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"gradient norm is {grad_norm}")
    if not dry_run:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def actor_minibatch(run, mini: RolloutBatch, metrics: dict, dry_run: bool = False) -> None:
    t = run.cfg.trainer
    params = PolicyLossParams(
        clip_low=t.clip_ratio_low,
        clip_high=t.clip_ratio_high,
        dual_clip_c=t.dual_clip_c,
        agg_mode=t.loss_agg_mode,
    )
    loss_fn = POLICY_LOSSES.get(t.policy_loss)
    norm = _norm(mini, t.max_new_tokens)
    kl_in_loss = t.kl.coef > 0 and t.kl.mode == "loss"
    lengths = mini.prompt_mask.sum(1) + mini.response_mask.sum(1)
    device = run.device
    for idx in micro_batch_indices(lengths, t.micro_batch_size):
        mb = trim(mini.select(idx)).to(device)
        with run.models.actor():
            logprobs, entropy = policy_logprobs(
                run.models.policy,
                mb,
                temperature=run.temperature,
                chunk_size=t.logprob_chunk_size,
                with_entropy=True,
                pack_len=run.pack_len,
            )
        # on-policy (one optimiser step per rollout) pi_old is the current policy: the
        # detached log-probs give ratio 1 with the right gradient, and save a forward pass
        old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
        if mb.old_logprobs is None and mb.rollout_logprobs is not None:
            gap = ((mb.rollout_logprobs - logprobs.detach()).abs() * mb.response_mask).sum()
            metrics["rollout/logprob_gap"] += float(gap) / norm.num_tokens
        loss, m = loss_fn(logprobs, old, mb.advantages, mb.response_mask, params, norm)
        ent = aggregate(entropy, mb.response_mask, t.loss_agg_mode, norm)
        if t.entropy_coef:
            loss = loss - t.entropy_coef * ent
        if kl_in_loss:
            kl = KL_ESTIMATORS.get(t.kl.estimator)(logprobs, mb.ref_logprobs)
            kl_loss = aggregate(kl, mb.response_mask, t.loss_agg_mode, norm)
            loss = loss + run.kl_ctl.value * kl_loss
            metrics["actor/kl_loss"] += float(kl_loss.detach())
        if not torch.isfinite(loss):
            run.actor_opt.zero_grad(set_to_none=True)
            raise NonFiniteError(f"policy loss is {float(loss)}")
        loss.backward()
        # the norm makes micro-batch values add up to the mini-batch value
        metrics["actor/pg_loss"] += float(loss.detach())
        metrics["actor/entropy"] += float(ent.detach())
        share = float(mb.size) / mini.size
        for key, value in m.items():
            metrics[f"actor/{key}"] += float(value) * share
    metrics["actor/grad_norm"] += _step(
        run.actor_opt, run.models.actor_params, t.max_grad_norm, dry_run
    )


def critic_minibatch(run, mini: RolloutBatch, metrics: dict, dry_run: bool = False) -> None:
    t = run.cfg.trainer
    norm = _norm(mini, t.max_new_tokens)
    lengths = mini.prompt_mask.sum(1) + mini.response_mask.sum(1)
    for idx in micro_batch_indices(lengths, t.micro_batch_size):
        mb = trim(mini.select(idx)).to(run.device)
        with run.models.critic():
            values = critic_values(run.models.critic_model, run.models.value_head, mb, run.pack_len)
        loss, m = value_loss(values, mb.values, mb.returns, mb.response_mask, t.value_clip, norm)
        loss = t.vf_coef * loss
        if not torch.isfinite(loss):
            run.critic_opt.zero_grad(set_to_none=True)
            raise NonFiniteError(f"value loss is {float(loss)}")
        loss.backward()
        metrics["critic/vf_loss"] += float(loss.detach())
        share = float(mb.size) / mini.size
        for key, value in m.items():
            metrics[f"critic/{key}"] += float(value) * share
    metrics["critic/grad_norm"] += _step(
        run.critic_opt, run.models.critic_params, t.max_grad_norm, dry_run
    )


def update(
    run, batch: RolloutBatch, generator: torch.Generator, dry_run: bool = False
) -> dict[str, float]:
    """``ppo_epochs`` passes over the batch in mini-batches; returns metrics averaged over
    the optimiser steps. Raises NonFiniteError (after skipping the step) on NaN/inf."""
    t = run.cfg.trainer
    n = t.samples_per_prompt
    mini_seqs = t.mini_batch_size * n // dist.world_size()  # this rank's part
    metrics: dict[str, float] = defaultdict(float)
    steps = 0
    for _ in range(t.ppo_epochs):
        order = (
            torch.randperm(batch.size, generator=generator)
            if t.ppo_epochs > 1 or (mini_seqs < batch.size)
            else torch.arange(batch.size)
        )
        for start in range(0, batch.size, mini_seqs):
            mini = batch.select(order[start : start + mini_seqs])
            actor_minibatch(run, mini, metrics, dry_run)
            if run.models.value_head is not None:
                critic_minibatch(run, mini, metrics, dry_run)
            steps += 1
    return {k: v / steps for k, v in metrics.items()}
