"""Step 7, the PPO-style update: epochs over mini-batches, gradient accumulation over
micro-batches.

Each mini-batch is one optimiser step. Its loss is normalised by the mini-batch's global
token/sequence counts (``LossNorm``, over ``train_mask``: loss tokens of valid samples), so
summing micro-batch losses gives the same loss and gradient whatever the micro-batch size.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from danka import distributed as dist
from danka.algorithms.losses import LossNorm, PolicyLossInput, aggregate, value_loss
from danka.trainer.forward import critic_values, micro_batch_indices, policy_logprobs, trim
from danka.trainer.run import Run
from danka.types import RolloutBatch


class NonFiniteError(RuntimeError):
    """The loss or the gradient was NaN/inf; the optimiser step was skipped."""


def _checked_loss(losses: list[torch.Tensor], opt, what: str) -> torch.Tensor:
    """The mini-batch's loss (the sum of its micro-batch losses, a device tensor) after
    checking it: a NaN/inf loss on ANY rank drops the gradients and raises on every rank
    (one collective), so all ranks skip the same optimiser step. Checked once per
    mini-batch, not per micro-batch, so the micro-batch loop never waits for the GPU; a
    non-finite micro-batch only poisons gradients that are dropped here."""
    stacked = torch.stack(losses)
    if dist.all_finite(stacked):
        return stacked.sum()
    opt.zero_grad(set_to_none=True)
    bad = stacked[~torch.isfinite(stacked)]
    here = float(bad[0]) if bad.numel() else float(stacked.sum())
    elsewhere = " (non-finite on another rank)" if math.isfinite(here) else ""
    raise NonFiniteError(f"{what} loss is {here}{elsewhere}")


def host_metrics(metrics: dict, steps: int) -> dict[str, float]:
    """The update's summed metrics / ``steps`` as floats; device tensors are read in ONE
    transfer (the micro-batch loop keeps them on the device: no host sync per micro-batch)."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) / steps for k, v in metrics.items() if k not in keys}
    if keys:
        device = metrics[keys[0]].device
        values = torch.stack([metrics[k].detach().float().reshape(()).to(device) for k in keys])
        out.update({k: v / steps for k, v in zip(keys, values.tolist())})
    return out


def loss_norm(mini: RolloutBatch, max_response_length: int) -> LossNorm:
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


def actor_minibatch(run: Run, mini: RolloutBatch, metrics: dict, dry_run: bool = False) -> None:
    """One optimiser step of the policy on ``mini``:
    loss = policy loss (x rollout-correction weights) - entropy_coef * entropy
           + kl_coef * KL(pi || pi_ref)   (kl.mode: loss)."""
    t, algo = run.cfg.trainer, run.algo
    norm = loss_norm(mini, t.max_new_tokens)
    kl_in_loss = algo.kl_mode is not None and algo.kl_mode.in_loss
    lengths = mini.prompt_mask.sum(1) + mini.response_mask.sum(1)
    losses: list[torch.Tensor] = []
    for idx in micro_batch_indices(lengths, run.state.micro_batch_size):
        mb = trim(mini.select(idx)).to(run.device, non_blocking=True)
        mask = mb.train_mask
        with run.models.actor():
            logprobs, entropy = policy_logprobs(
                run.models.policy,
                mb,
                temperature=run.temperature,
                chunk_size=t.logprob_chunk_size,
                with_entropy=True,
                pack_len=run.pack_len,
            )
        if mb.old_is_current:  # ratio 1 with the right gradient (see RolloutBatch)
            old = logprobs.detach()
            if mb.rollout_logprobs is not None:
                gap = ((mb.rollout_logprobs - old).abs() * mb.loss_mask).sum()
                metrics["rollout/logprob_gap"] += gap / norm.num_tokens
        elif mb.old_logprobs is None:
            raise ValueError("old_logprobs missing and the batch is not marked old_is_current")
        else:
            old = mb.old_logprobs
        # a non-negative per-token weight w folds into the advantage: w * L(A) = L(w * A)
        # for the clipped surrogate (max of two terms linear in A) and its dual clip
        adv = mb.advantages if mb.is_weights is None else mb.advantages * mb.is_weights
        inputs = PolicyLossInput(logprobs, old, adv, mask)
        pg_loss, m = algo.policy_loss(inputs, algo.loss_params, norm)
        ent = aggregate(entropy, mask, t.loss_agg_mode, norm)
        loss = pg_loss - t.entropy_coef * ent if t.entropy_coef else pg_loss
        if kl_in_loss:
            kl = algo.kl_estimator(logprobs, mb.ref_logprobs)
            kl_loss = aggregate(kl, mask, t.loss_agg_mode, norm)
            loss = loss + run.kl_ctl.value * kl_loss
            metrics["actor/kl_loss"] += kl_loss.detach()
            # the adaptive controller's quantity: mean KL per trained token
            metrics["actor/kl_token_mean"] += (kl.detach() * mask).sum() / norm.num_tokens
        _backward(loss, losses, metrics, "actor", m, float(mb.size) / mini.size)
        # the norm makes micro-batch values add up to the mini-batch value
        metrics["actor/pg_loss"] += pg_loss.detach()
        metrics["actor/entropy"] += ent.detach()
    metrics["actor/loss"] += _checked_loss(losses, run.actor_opt, "policy")
    metrics["actor/grad_norm"] += _step(
        run.actor_opt, run.models.actor_params, t.max_grad_norm, dry_run
    )


def _backward(
    loss: torch.Tensor, losses: list, metrics: dict, prefix: str, parts: dict, share: float
) -> None:
    """Backward of one micro-batch's loss (kept in ``losses``); its per-sample metrics
    (weighted by the micro-batch's ``share`` of the mini-batch) are summed as device
    tensors. Every rank runs every backward (FSDP2's reduce-scatters stay matched);
    non-finite losses are handled once per mini-batch by :func:`_checked_loss`."""
    loss.backward()
    losses.append(loss.detach())
    for key, value in parts.items():
        metrics[f"{prefix}/{key}"] += value * share


def critic_minibatch(run: Run, mini: RolloutBatch, metrics: dict, dry_run: bool = False) -> None:
    """One optimiser step of the critic: clipped value loss towards ``returns``."""
    t = run.cfg.trainer
    norm = loss_norm(mini, t.max_new_tokens)
    lengths = mini.prompt_mask.sum(1) + mini.response_mask.sum(1)
    losses: list[torch.Tensor] = []
    for idx in micro_batch_indices(lengths, run.state.micro_batch_size):
        mb = trim(mini.select(idx)).to(run.device, non_blocking=True)
        with run.models.critic():
            values = critic_values(run.models.critic_model, run.models.value_head, mb, run.pack_len)
        loss, m = value_loss(values, mb.values, mb.returns, mb.train_mask, t.value_clip, norm)
        loss = t.vf_coef * loss
        _backward(loss, losses, metrics, "critic", m, float(mb.size) / mini.size)
    metrics["critic/vf_loss"] += _checked_loss(losses, run.critic_opt, "value")
    metrics["critic/grad_norm"] += _step(
        run.critic_opt, run.models.critic_params, t.max_grad_norm, dry_run
    )


def update(
    run: Run,
    batch: RolloutBatch,
    generator: torch.Generator,
    dry_run: bool = False,
    train_actor: bool = True,
) -> dict[str, float]:
    """``ppo_epochs`` passes over the batch in mini-batches; returns metrics averaged over
    the optimiser steps. Raises NonFiniteError (after skipping the step) on NaN/inf.
    ``train_actor=False`` updates only the critic (trainer.critic_warmup_steps)."""
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
            if train_actor:
                actor_minibatch(run, mini, metrics, dry_run)
            if run.models.value_head is not None:
                critic_minibatch(run, mini, metrics, dry_run)
            steps += 1
    return host_metrics(metrics, steps)
