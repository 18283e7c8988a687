"""The training loop. Each step:

1. pick prompts        2. rollout (sample n answers each)     3. rewards
4. reference log-probs (KL) and values (critic)               5. advantages
6. update (PPO epochs over mini-/micro-batches)               7. log
8. checkpoint          9. evaluate on held-out prompts
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import torch

from danka import distributed as dist
from danka.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInput,
    sequence_rewards_to_tokens,
)
from danka.algorithms.kl import apply_kl_in_reward
from danka.rollout.base import SamplingParams
from danka.trainer.forward import batched, critic_values, effective_token_ratio, policy_logprobs
from danka.trainer.guards import OutOfMemory, oom_guard
from danka.trainer.run import Run
from danka.trainer.update import NonFiniteError, update
from danka.types import RolloutBatch


def rollout(run: Run, prompts: list[list[int]]) -> RolloutBatch:
    """Sample ``samples_per_prompt`` answers to each prompt (token ids) from the policy."""
    t = run.cfg.trainer
    params = SamplingParams(
        n=t.samples_per_prompt,
        temperature=t.temperature,
        top_p=t.top_p,
        top_k=t.top_k,
        max_new_tokens=t.max_new_tokens,
    )
    with run.models.actor():
        return run.engine.generate(
            run.models.policy, prompts, params, eos_ids=run.eos_ids, pad_id=run.pad_id
        )


def score(run: Run, batch: RolloutBatch, prompt_idx: list[int], metrics: dict) -> list[str]:
    """Fill ``batch.rewards``; samples whose reward was skipped get an empty response mask."""
    n = run.cfg.trainer.samples_per_prompt
    rows = [run.train.rows[prompt_idx[g]] for g in batch.group_index.tolist()]
    texts = [run.train.texts[prompt_idx[g]] for g in batch.group_index.tolist()]
    completions = run.decode(batch)
    out = run.rewards(rows, texts, completions)
    batch.rewards = out.scores.float().cpu()
    invalid = ~out.valid.cpu()
    if invalid.any():
        batch.response_mask[invalid] = 0.0
        batch.rewards[invalid] = 0.0
    metrics["reward"] = float(batch.rewards[~invalid].mean()) if (~invalid).any() else 0.0
    run.last_reward_parts = {name: v.float().cpu() for name, v in out.per_function.items()}
    for name, value in run.last_reward_parts.items():
        metrics[f"reward/{name}"] = float(value[~invalid].mean())
    metrics["reward/error_rate"] = out.num_errors / max(1, len(completions))
    groups = batch.rewards.view(-1, n)
    if n > 1:
        flat = (groups.max(1).values - groups.min(1).values).abs() < 1e-8
        metrics["reward/zero_adv_groups"] = float(flat.float().mean())
    metrics["response_length"] = float(batch.response_mask.sum(1).mean())
    metrics["response/truncated"] = float(batch.truncated.float().mean())
    return completions


def prepare(run: Run, batch: RolloutBatch, metrics: dict) -> None:
    """Reference log-probs, old log-probs (off-policy updates only), values, advantages."""
    t = run.cfg.trainer
    micro = t.micro_batch_size
    chunk = t.logprob_chunk_size
    kw = dict(temperature=run.temperature, chunk_size=chunk, pack_len=run.pack_len)
    on_policy = t.ppo_epochs == 1 and t.mini_batch_size == t.batch_size
    if not on_policy:
        # on-policy, the update's own detached log-probs are pi_old: one forward saved (the
        # engine-vs-training log-prob gap is then measured inside the update)
        with run.models.actor() as policy:
            batch.old_logprobs = batched(policy_logprobs, policy, batch, micro, **kw)
        if batch.rollout_logprobs is not None:
            gap = (batch.rollout_logprobs - batch.old_logprobs).abs() * batch.response_mask
            metrics["rollout/logprob_gap"] = float(
                gap.sum() / batch.response_mask.sum().clamp(min=1)
            )
    if t.kl.coef > 0:
        with run.models.reference() as ref:
            batch.ref_logprobs = batched(policy_logprobs, ref, batch, micro, **kw)
    if run.models.value_head is not None:
        with run.models.critic() as critic:
            batch.values = batched(
                lambda m, mb: critic_values(m, run.models.value_head, mb, run.pack_len),
                critic,
                batch,
                micro,
            )
    token_rewards = sequence_rewards_to_tokens(batch.rewards, batch.response_mask)
    if t.kl.coef > 0 and t.kl.mode == "reward":
        old = batch.old_logprobs
        if old is None:
            with run.models.actor() as policy:
                old = batched(policy_logprobs, policy, batch, micro, **kw)
        token_rewards, mean_kl = apply_kl_in_reward(
            token_rewards,
            old,
            batch.ref_logprobs,
            batch.response_mask,
            t.kl.estimator,
            run.kl_ctl.value,
        )
        if dist.is_active():  # the adaptive controller must move the same way on every rank
            mean_kl = dist.all_mean(mean_kl)
        metrics["kl"] = mean_kl
        run.kl_ctl.update(mean_kl, n_steps=t.batch_size)
    adv_in = AdvantageInput(
        token_rewards=token_rewards,
        response_mask=batch.response_mask,
        group_index=batch.group_index,
        values=batch.values,
        gamma=t.gamma,
        lam=t.lam,
    )
    estimator = ADVANTAGE_ESTIMATORS.get(t.advantage_estimator, where="trainer.advantage_estimator")
    batch.advantages, batch.returns = estimator(adv_in)


def update_with_oom_retry(run: Run, batch: RolloutBatch) -> dict:
    """The update; with ``trainer.auto_micro_batch`` an out-of-memory halves the micro-batch
    and retries (no optimizer step has happened yet when the forward/backward runs out)."""
    t = run.cfg.trainer
    while True:
        try:
            with oom_guard("update", run):
                return update(run, batch, run.update_generator)
        except OutOfMemory:
            if not t.auto_micro_batch or t.micro_batch_size == 1:
                raise
            run.actor_opt.zero_grad(set_to_none=True)
            if run.critic_opt is not None:
                run.critic_opt.zero_grad(set_to_none=True)
            t.micro_batch_size = max(1, t.micro_batch_size // 2)
            run.log.warning(
                f"out of memory in the update: micro_batch_size -> {t.micro_batch_size}"
            )


def train_step(run: Run, step: int) -> tuple[dict, RolloutBatch, list[str]]:
    metrics: dict[str, float] = {}
    timings: dict[str, float] = defaultdict(float)
    t0 = time.perf_counter()
    # 1. pick prompts
    prompt_idx = run.sampler.next_batch()
    if dist.is_active():  # this rank's prompts; a prompt's group stays on one rank
        prompt_idx = dist.shard(prompt_idx)
    run.last_prompt_idx = prompt_idx
    # 2. rollout
    with oom_guard("rollout", run):
        batch = rollout(run, [run.train.ids[i] for i in prompt_idx])
    timings["rollout"] = time.perf_counter() - t0
    # 3. rewards
    t1 = time.perf_counter()
    completions = score(run, batch, prompt_idx, metrics)
    timings["reward"] = time.perf_counter() - t1
    # 4-5. reference log-probs, values, advantages
    t2 = time.perf_counter()
    with oom_guard("log-probs", run):
        prepare(run, batch, metrics)
    timings["prepare"] = time.perf_counter() - t2
    # 6. update
    t3 = time.perf_counter()
    try:
        metrics.update(update_with_oom_retry(run, batch))
        metrics["skipped_step"] = 0.0
    except NonFiniteError as err:
        run.log.warning(f"step {step}: {err}; optimizer step skipped")
        metrics["skipped_step"] = 1.0
    run.actor_sched.step()
    if run.critic_sched is not None:
        run.critic_sched.step()
    timings["update"] = time.perf_counter() - t3
    metrics["loss"] = metrics.get("actor/pg_loss", float("nan"))
    metrics["lr"] = run.actor_sched.get_last_lr()[0]
    metrics["kl_coef"] = float(run.kl_ctl.value)
    if "actor/kl_loss" in metrics:
        metrics.setdefault("kl", metrics["actor/kl_loss"])
    metrics["packing/effective_token_ratio"] = effective_token_ratio(
        batch, run.cfg.trainer.micro_batch_size, run.pack_len
    )
    total = time.perf_counter() - t0
    for key, value in timings.items():
        metrics[f"time/{key}"] = value
    metrics["time/step"] = total
    if dist.is_active():
        metrics = dist.reduce_metrics(metrics)
    tokens = float(batch.response_mask.sum())
    metrics["throughput/gen_tokens_per_s"] = tokens / max(timings["rollout"], 1e-9)
    if torch.cuda.is_available() and run.device.type == "cuda":
        metrics["memory/peak_gib"] = torch.cuda.max_memory_allocated(run.device) / 2**30
    return metrics, batch, completions


def is_finite_step(metrics: dict) -> bool:
    return metrics.get("skipped_step", 0.0) == 0.0 and math.isfinite(metrics.get("loss", 0.0))
