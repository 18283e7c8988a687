"""The stages of one training step, in the order ``fit`` calls them. Each reads what
earlier stages put on the ``RolloutBatch`` and adds its own fields (see danka/types.py).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from danka import distributed as dist
from danka.algorithms._masked import masked_whiten
from danka.algorithms.advantages import AdvantageInput, sequence_rewards_to_tokens
from danka.algorithms.kl import apply_kl_in_reward
from danka.rewards.shaping import overlong_penalty, response_lengths
from danka.rollout.base import SamplingParams, engine_meta
from danka.trainer.agent import AgentStep, agent_rollout
from danka.trainer.dynamic_sampling import mask_truncated
from danka.trainer.forward import batched, critic_values, policy_logprobs
from danka.trainer.guards import OutOfMemory, oom_guard
from danka.trainer.run import Run
from danka.trainer.update import update
from danka.types import RolloutBatch


def sample_prompts(run: Run) -> list[int]:
    """Row indices of this step's prompts (this rank's share under torchrun; a prompt's
    group stays on one rank)."""
    idx = run.sampler.next_batch()
    return dist.shard(idx) if dist.is_active() else idx


def rollout(run: Run, prompt_idx: list[int]) -> RolloutBatch:
    """Sample ``samples_per_prompt`` answers to each prompt from the live policy (multi-turn
    with ``run.agent``: see :func:`agent_step`)."""
    if run.agent is not None:
        return agent_step(run, prompt_idx).batch
    return _single_turn(run, prompt_idx)


def sampling_params(run: Run) -> SamplingParams:
    t = run.cfg.trainer
    return SamplingParams(
        n=t.samples_per_prompt,
        temperature=t.temperature,
        top_p=t.top_p,
        top_k=t.top_k,
        max_new_tokens=t.max_new_tokens,
    )


def _rollout_context(run: Run):
    gather = engine_meta(run.engine.name).reads_weights  # full weights under FSDP2
    weights = dist.rollout_weights(run.models.policy) if gather else nullcontext()
    return weights


def _single_turn(run: Run, prompt_idx: list[int]) -> RolloutBatch:
    with oom_guard("rollout", run), _rollout_context(run), run.models.actor():
        batch = run.engine.generate(
            run.models.policy,
            [run.train.ids[i] for i in prompt_idx],
            sampling_params(run),
            eos_ids=run.eos_ids,
            pad_id=run.pad_id,
        )
    batch.prompt_index = torch.tensor(prompt_idx, dtype=torch.long)[batch.group_index]
    return batch


def agent_step(run: Run, prompt_idx: list[int]) -> AgentStep:
    """Step 2 with ``rollout.tools`` / ``rollout.environment``: the multi-turn loop; its
    batch's ``loss_mask`` is 0 on tool and environment tokens."""
    rows = [run.train.rows[i] for i in prompt_idx]
    with oom_guard("rollout", run), _rollout_context(run), run.models.actor():
        return agent_rollout(run, rows, prompt_idx, sampling_params(run))


def score(
    run: Run,
    batch: RolloutBatch,
    completions: list[str],
    env_rewards: torch.Tensor | None = None,
) -> dict[str, float]:
    """Fill ``rewards`` and ``reward_parts``; ``env_rewards`` (B,) (an environment's summed
    step rewards) is added as part ``env``. A sample whose reward was skipped
    (reward.on_error: skip_sample) gets ``valid`` False and reward 0. Then DAPO's overlong
    penalty is added (``reward.overlong_buffer``, part ``overlong``) and, with
    ``trainer.mask_truncated``, truncated samples become invalid (no loss).

    ``reward/<name>`` is the mean over the valid samples the function applies to (a TRL
    function returning None does not apply); ``reward/not_applicable`` the fraction of
    samples no function applied to."""
    t, ob = run.cfg.trainer, run.cfg.reward.overlong_buffer
    idx = batch.prompt_index.tolist()
    rows, texts = [run.train.rows[i] for i in idx], [run.train.texts[i] for i in idx]
    out = run.rewards(rows, texts, completions)
    batch.valid = batch.valid & out.valid.cpu()
    scores = out.scores.float().cpu()
    batch.reward_parts = {name: v.float().cpu() for name, v in out.per_function.items()}
    if env_rewards is not None:
        batch.reward_parts["env"] = env_rewards.float().cpu()
        scores = scores + batch.reward_parts["env"]
    if ob.length > 0:  # DAPO overlong shaping: soft penalty in the last `length` tokens
        pen = overlong_penalty(
            response_lengths(batch.response_mask),
            max_new_tokens=response_budget(run),
            buffer=ob.length,
            penalty=ob.penalty,
        )
        batch.reward_parts["overlong"] = pen
        scores = scores + pen
    batch.rewards = torch.where(batch.valid, scores, 0.0)
    ok = batch.valid
    metrics = {
        "reward": float(batch.rewards[ok].mean()) if ok.any() else 0.0,
        "reward/error_rate": out.error_rate,
        "reward/not_applicable": out.num_not_applicable / max(1, len(completions)),
        "reward/valid_frac": float(ok.float().mean()),
        "response_length": float(batch.response_mask.sum(1).mean()),
        "response/truncated": float(batch.truncated.float().mean()),
    }
    for name, value in batch.reward_parts.items():
        applies = ok & out.applicable[name].cpu() if name in out.applicable else ok
        metrics[f"reward/{name}"] = float(value[applies].mean()) if applies.any() else 0.0
    n = t.samples_per_prompt
    if n > 1 and batch.rewards.numel() % n == 0:
        groups = batch.rewards.view(-1, n)
        flat = (groups.max(1).values - groups.min(1).values).abs() < 1e-8
        metrics["reward/zero_adv_groups"] = float(flat.float().mean())
    if t.mask_truncated:  # TRL mask_truncated_completions: a cut answer's reward misleads
        masked = mask_truncated(batch)
        batch.loss_mask, batch.valid = masked.loss_mask, masked.valid
    return metrics


def response_budget(run: Run) -> int:
    """Response tokens a sample may have: trainer.max_new_tokens, or for an agent rollout
    rollout.max_total_tokens (all turns and tool responses; 0 = max_new_tokens)."""
    t = run.cfg.trainer
    return (run.cfg.rollout.max_total_tokens or t.max_new_tokens) if run.agent else t.max_new_tokens


def logprobs(run: Run, batch: RolloutBatch) -> dict[str, float]:
    """Old log-probs (or the explicit on-policy shortcut), reference log-probs, and the
    rollout/trainer mismatch correction."""
    t, algo, metrics = run.cfg.trainer, run.algo, {}
    kw = dict(temperature=run.temperature, chunk_size=t.logprob_chunk_size, pack_len=run.pack_len)
    micro = run.state.micro_batch_size
    one_step = t.ppo_epochs == 1 and t.mini_batch_size == t.batch_size
    # on-policy, pi_old is the policy at the update's only optimiser step: its own detached
    # log-probs serve, one forward saved. The correction needs them here, before the update.
    batch.old_is_current = one_step and algo.correction is None
    with oom_guard("log-probs", run):
        if not batch.old_is_current:
            with run.models.actor() as policy:
                batch.old_logprobs = batched(policy_logprobs, policy, batch, micro, **kw)
            if batch.rollout_logprobs is not None:
                # over model tokens: inserted tool tokens have no rollout log-prob
                gap = (batch.rollout_logprobs - batch.old_logprobs).abs() * batch.loss_mask
                metrics["rollout/logprob_gap"] = float(
                    gap.sum() / batch.loss_mask.sum().clamp(min=1)
                )
        if algo.needs_reference:
            with run.models.reference() as ref:
                batch.ref_logprobs = batched(policy_logprobs, ref, batch, micro, **kw)
    if algo.correction is not None:
        fix = algo.correction(
            batch.old_logprobs, batch.rollout_logprobs, batch.train_mask, algo.correction_cap
        )
        batch.is_weights = fix.weights
        batch.valid = batch.valid & fix.keep
        metrics.update(fix.metrics)
    return metrics


def values(run: Run, batch: RolloutBatch) -> None:
    """Critic values V(s_t) (only for estimators that need a critic)."""
    if not run.algo.needs_critic:
        return
    with oom_guard("log-probs", run), run.models.critic() as critic:
        batch.values = batched(
            lambda m, mb: critic_values(m, run.models.value_head, mb, run.pack_len),
            critic,
            batch,
            run.state.micro_batch_size,
        )


def advantages(run: Run, batch: RolloutBatch) -> dict[str, float]:
    """Token rewards (the score on the last token, minus the KL penalty under
    kl.mode: reward), then the registered estimator: advantages, and returns for a critic."""
    t, algo, metrics = run.cfg.trainer, run.algo, {}
    token_rewards = sequence_rewards_to_tokens(batch.rewards, batch.loss_mask)
    if algo.kl_mode is not None and algo.kl_mode.in_reward:
        old = batch.old_logprobs
        if old is None:  # on-policy: the log-probs of the policy that sampled
            kw = dict(temperature=run.temperature, chunk_size=t.logprob_chunk_size)
            with oom_guard("log-probs", run), run.models.actor() as policy:
                old = batched(
                    policy_logprobs, policy, batch, run.state.micro_batch_size,
                    pack_len=run.pack_len, **kw,
                )  # fmt: skip
        token_rewards, mean_kl = apply_kl_in_reward(
            token_rewards, old, batch.ref_logprobs, batch.train_mask, t.kl.estimator,
            run.kl_ctl.value,
        )  # fmt: skip
        metrics["kl"] = mean_kl
    adv_in = AdvantageInput(
        token_rewards=token_rewards,
        response_mask=batch.loss_mask,
        group_index=batch.group_index,
        values=batch.values,
        gamma=t.gamma,
        lam=t.lam,
        valid=batch.valid,
        whitener=dist.global_masked_whiten if dist.is_active() else masked_whiten,
    )
    batch.advantages, batch.returns = algo.estimator(adv_in)
    return metrics


def update_actor_critic(run: Run, batch: RolloutBatch, step: int) -> dict[str, float]:
    """The update; with ``trainer.auto_micro_batch`` an out-of-memory halves the micro-batch
    and retries (no optimizer step has happened yet when the forward/backward runs out).
    During ``trainer.critic_warmup_steps`` only the critic learns."""
    train_actor = step > run.cfg.trainer.critic_warmup_steps
    while True:
        try:
            with oom_guard("update", run):
                return update(run, batch, run.update_generator, train_actor=train_actor)
        except OutOfMemory:
            if not run.cfg.trainer.auto_micro_batch or run.state.micro_batch_size == 1:
                raise
            run.actor_opt.zero_grad(set_to_none=True)
            if run.critic_opt is not None:
                run.critic_opt.zero_grad(set_to_none=True)
            run.state.micro_batch_size = max(1, run.state.micro_batch_size // 2)
            run.log.warning(
                f"out of memory in the update: micro_batch_size -> {run.state.micro_batch_size}"
            )


def adapt_kl(run: Run, metrics: dict[str, float]) -> None:
    """Move the adaptive KL coefficient towards its target with the KL measured this
    step (mean per trained token: from the reward penalty or from the loss term)."""
    kl = dist.measured_kl(metrics)  # same on every rank (collective under torchrun)
    if kl is None or run.algo.kl_mode is None:
        return
    metrics.setdefault("kl", kl)
    run.kl_ctl.update(kl, n_steps=run.cfg.trainer.batch_size)
