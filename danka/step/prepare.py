"""Steps 4-6: what the update needs besides the samples: old and reference log-probs
(4), the critic's values (5) and the advantages (6). Each takes the scored samples and
returns its own record; :func:`advantages` assembles the ``TrainBatch``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from danka import distributed as dist
from danka.algorithms._masked import masked_whiten
from danka.algorithms.advantages import AdvantageInput, sequence_rewards_to_tokens
from danka.algorithms.kl import apply_kl_in_reward
from danka.step.algorithm import Algorithm
from danka.step.forward import ForwardSettings, batched, critic_values, policy_logprobs
from danka.step.guards import Sizes, oom_guard
from danka.step.model_set import ModelSet
from danka.step.records import ON_POLICY, OldAndRef, Prepared, Scored, TrainBatch


@dataclass(frozen=True)
class PrepareSettings:
    """What steps 4-6 read besides the models and the algorithm."""

    forward: ForwardSettings
    one_optimizer_step: bool  # ppo_epochs 1 and one mini-batch: pi_old is the live policy
    gamma: float
    lam: float
    kl_estimator: str
    sizes: Sizes  # for an out-of-memory message


def on_policy_shortcut(algo: Algorithm, one_optimizer_step: bool) -> bool:
    """pi_old IS the policy at the update's only optimiser step, so the update's own
    detached log-probs serve as pi_old (one forward saved), unless something needs pi_old
    BEFORE the update: a rollout correction, or a KL penalty in the reward."""
    kl_in_reward = algo.kl_mode is not None and algo.kl_mode.in_reward
    return one_optimizer_step and algo.correction is None and not kl_in_reward


def old_and_ref(
    models: ModelSet, algo: Algorithm, scored: Scored, s: PrepareSettings, micro: int
) -> OldAndRef:
    """Step 4: log pi_old (or ON_POLICY), log pi_ref when a KL term needs it, and the
    rollout/trainer mismatch correction; forwards of ``micro`` sequences."""
    batch = scored.batch
    device = next(models.policy.parameters()).device
    old, ref, gap = ON_POLICY, None, None
    with oom_guard("logprobs", s.sizes.at(micro), device):
        if not on_policy_shortcut(algo, s.one_optimizer_step):
            with models.actor() as policy:
                old = batched(policy_logprobs, policy, batch, micro, settings=s.forward)
            if batch.rollout_logprobs is not None:
                # over model tokens: inserted tool tokens have no rollout log-prob
                diff = (batch.rollout_logprobs - old).abs() * batch.loss_mask
                gap = float(diff.sum() / batch.loss_mask.sum().clamp(min=1))
        if algo.needs_reference:
            with models.reference() as reference:
                ref = batched(policy_logprobs, reference, batch, micro, settings=s.forward)
    valid, weights, metrics = scored.valid, None, {}
    if algo.correction is not None:
        fix = algo.correction(old, batch.rollout_logprobs, scored.train_mask, algo.correction_cap)
        weights, valid, metrics = fix.weights, valid & fix.keep, dict(fix.metrics)
    return OldAndRef(
        old=old, ref=ref, is_weights=weights, valid=valid, logprob_gap=gap, correction=metrics
    )


def values(models: ModelSet, algo: Algorithm, scored: Scored, s: PrepareSettings, micro: int):
    """Step 5: critic values V(s_t) (B, R) for estimators that need a critic, else None;
    forwards of ``micro`` sequences."""
    if not algo.needs_critic:
        return None
    device = next(models.policy.parameters()).device
    with oom_guard("values", s.sizes.at(micro), device), models.critic() as critic:
        return batched(
            critic_values,
            critic,
            scored.batch,
            micro,
            value_head=models.value_head,
            settings=s.forward,
        )


def advantages(
    algo: Algorithm,
    scored: Scored,
    logp: OldAndRef,
    critic_v: torch.Tensor | None,
    kl_coef: float,
    s: PrepareSettings,
) -> Prepared:
    """Step 6: token rewards (the score on the last loss token, minus ``kl_coef`` x the
    per-token KL under kl.mode: reward), then the registered estimator: advantages, and
    returns for a critic."""
    batch = scored.batch
    train_mask = batch.loss_mask * logp.valid.to(batch.loss_mask.dtype).unsqueeze(-1)
    token_rewards = sequence_rewards_to_tokens(scored.rewards, batch.loss_mask)
    kl_in_reward = None
    if algo.kl_mode is not None and algo.kl_mode.in_reward:
        token_rewards, kl_in_reward = apply_kl_in_reward(
            token_rewards, logp.old, logp.ref, train_mask, s.kl_estimator, kl_coef
        )
    whitener = dist.global_masked_whiten if dist.is_active() else masked_whiten
    adv_in = AdvantageInput(
        token_rewards=token_rewards,
        response_mask=batch.loss_mask,
        group_index=batch.group_index,
        values=critic_v,
        gamma=s.gamma,
        lam=s.lam,
        valid=logp.valid,
        whitener=whitener,
    )
    adv, returns = algo.estimator(adv_in)
    train = TrainBatch.of(
        batch,
        valid=logp.valid,
        advantages=adv,
        old_logprobs=logp.old,
        rollout_logprobs=batch.rollout_logprobs,
        ref_logprobs=logp.ref,
        is_weights=logp.is_weights,
        values=critic_v,
        returns=returns,
    )
    return Prepared(batch=train, old_and_ref=logp, kl_in_reward=kl_in_reward)
