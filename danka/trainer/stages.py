"""The stages of one training step, each bound once to exactly what it needs.

``build_stages(run)`` is the only place that reads the config for a step; every stage
function (sample, score, old_and_ref, values, advantages, update) takes its own inputs and
settings and returns a typed record (danka/trainer/records.py), so a test or a benchmark
builds a stage's inputs directly, without a ``Run``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from danka import distributed as dist
from danka.rewards.combine import RewardComputer
from danka.rollout.base import SamplingParams
from danka.trainer import prepare as prep
from danka.trainer.dynamic_sampling import DynamicSampler
from danka.trainer.forward import ForwardSettings
from danka.trainer.guards import DoesNotFit, OutOfMemory, Sizes, oom_guard
from danka.trainer.models import ModelSet
from danka.trainer.records import OldAndRef, Prepared, Rollout, Scored, UpdateStats
from danka.trainer.run import Algorithm, PromptSet, Run
from danka.trainer.sample import SampleContext, sample
from danka.trainer.sampler import PromptSampler
from danka.trainer.score import ScoreSettings, score
from danka.trainer.state import RunState
from danka.trainer.update import NonFiniteError, Optimizers, UpdateSettings, update


@dataclass
class Stages:
    """One step's stages with their inputs (see :func:`build_stages`)."""

    sampler: PromptSampler
    sampling: SampleContext
    rewards: RewardComputer
    prompts: PromptSet
    scoring: ScoreSettings
    models: ModelSet
    algo: Algorithm
    preparing: prep.PrepareSettings
    updating: UpdateSettings
    opts: Optimizers
    kl_ctl: object  # FixedKLController | AdaptiveKLController
    state: RunState
    generator: torch.Generator
    log: logging.Logger
    dynamic: DynamicSampler | None = None
    critic_warmup_steps: int = 0
    auto_micro_batch: bool = False
    kl_n_steps: int = 1  # prompts per step, the adaptive KL controller's unit

    def next_prompts(self) -> list[int]:
        """Row indices of this step's prompts (this rank's share under torchrun; a prompt's
        group stays on one rank)."""
        idx = self.sampler.next_batch()
        return dist.shard(idx) if dist.is_active() else idx

    def sample(self, prompt_idx: list[int]) -> Rollout:
        """Step 2; with ``speed.auto_micro_batch`` an out-of-memory halves the engine's
        sequences per generate call and samples again (kept for the rest of the run; the
        new samples are drawn afresh, so they differ from the ones the first try would have
        given). One group per call that does not fit: the explanation stands."""
        n = self.sampling.params.n
        return self._retry_smaller(
            "rollout",
            "sequences per generate call",
            lambda: sample(self.sampling, prompt_idx),
            lambda: self.sampling.engine.halve_batch(n, n * len(prompt_idx)),
        )

    def score(self, rollout: Rollout) -> Scored:
        return score(self.rewards, self.prompts, rollout, self.scoring)

    def old_and_ref(self, scored: Scored) -> OldAndRef:
        return self._retry_smaller(
            "log-probs", "micro_batch_size",
            lambda: prep.old_and_ref(self.models, self.algo, scored, self.preparing),
            self._halve_micro,
        )  # fmt: skip

    def values(self, scored: Scored) -> torch.Tensor | None:
        return self._retry_smaller(
            "log-probs", "micro_batch_size",
            lambda: prep.values(self.models, self.algo, scored, self.preparing),
            self._halve_micro,
        )  # fmt: skip

    def advantages(self, scored: Scored, logp: OldAndRef, values) -> Prepared:
        coef = float(self.kl_ctl.value)
        return prep.advantages(self.algo, scored, logp, values, coef, self.preparing)

    def update(self, prepared: Prepared, step: int) -> UpdateStats:
        """Step 7. A non-finite loss or gradient skips the optimiser step (reported in the
        result); an out-of-memory halves the micro-batch and retries (:meth:`_retry_smaller`;
        no optimiser step has happened yet when a forward/backward runs out).
        During ``trainer.critic_warmup_steps`` only the critic learns. The schedules step
        either way."""
        try:
            return self._update(prepared, step)
        except NonFiniteError as err:
            return UpdateStats(actor=None, critic=None, skipped=True, reason=str(err))
        finally:
            self.opts.step_schedules()

    def run_update(
        self,
        prepared: Prepared,
        *,
        train_actor: bool = True,
        dry_run: bool = False,
        generator: torch.Generator | None = None,
    ) -> UpdateStats:
        """The update itself (``dry_run``: the preflight's, weights left alone)."""
        device = next(self.models.policy.parameters()).device
        with oom_guard("update", self.preparing.sizes, device):
            return update(
                self.models, self.algo, self.opts, prepared.batch, self.updating,
                micro_size=self.state.micro_batch_size, kl_coef=float(self.kl_ctl.value),
                generator=generator or self.generator, train_actor=train_actor,
                dry_run=dry_run,
            )  # fmt: skip

    def _update(self, prepared: Prepared, step: int) -> UpdateStats:
        train_actor = step > self.critic_warmup_steps

        def halve() -> tuple[int, int] | None:
            self.opts.zero_grad()  # the gradients of the micro-batches that ran
            return self._halve_micro()

        return self._retry_smaller(
            "update", "micro_batch_size",
            lambda: self.run_update(prepared, train_actor=train_actor), halve,
        )  # fmt: skip

    def _halve_micro(self) -> tuple[int, int] | None:
        """Halve the run's micro-batch: ``(before, after)``, None at 1. The same numbers up
        to float rounding: losses are normalised by the step's token counts."""
        micro = self.state.micro_batch_size
        if micro == 1:
            return None
        self.state.micro_batch_size = micro // 2
        return micro, micro // 2

    def _retry_smaller(self, phase: str, what: str, attempt, shrink):
        """``attempt()``; with ``speed.auto_micro_batch`` (the default) an out-of-memory
        runs ``shrink()`` (``(before, after)`` of ``what``, None when it cannot shrink) and
        the phase again, one ``[WARNING]`` per shrink; the smaller size stays for the rest
        of the run. Where nothing shrinks, or with the setting off, the phase's
        explanation (:class:`OutOfMemory`, exit 3) stands; where the retries shrank as far
        as they go, :class:`DoesNotFit` (exit 2: the settings do not fit the card)."""
        while True:
            try:
                return attempt()
            except OutOfMemory as err:
                sizes = shrink() if self.auto_micro_batch else None
                if sizes is None:
                    if self.auto_micro_batch:
                        context = f"at the smallest {what} the halving retries reach"
                        raise DoesNotFit.because(err, context) from None
                    raise
                self.log.warning(
                    f"out of memory in the {phase}: {what} {sizes[0]} -> {sizes[1]} "
                    "(kept for the rest of the run)"
                )

    def measured_kl(self, prepared: Prepared, upd: UpdateStats) -> float | None:
        """The step's KL per trained token (the same on every rank: a collective), from
        the reward penalty or from the loss term; None without a KL term."""
        if self.algo.kl_mode is None:
            return None
        share = upd.actor.kl_token_mean if upd.actor is not None else None
        return dist.measured_kl(prepared.kl_in_reward, share)

    def adapt_kl(self, kl: float | None) -> None:
        """Move the adaptive KL coefficient towards its target (a fixed one stays)."""
        if kl is not None:
            self.kl_ctl.update(kl, n_steps=self.kl_n_steps)


def forward_settings(run: Run) -> ForwardSettings:
    sp = run.cfg.speed
    return ForwardSettings(
        temperature=run.temperature,
        chunk_size=run.state.logprob_chunk_size,
        pack_len=run.pack_len,
        shared_prefix=sp.shared_prefix_forward,
        fused_head=sp.fused_logprob_head,
    )


def response_budget(run: Run) -> int:
    """Response tokens a sample may have: trainer.max_new_tokens, or for an agent rollout
    agent.max_total_tokens (all turns and tool responses; 0 = max_new_tokens)."""
    t = run.cfg.trainer
    return (run.cfg.agent.max_total_tokens or t.max_new_tokens) if run.agent else t.max_new_tokens


def sizes(run: Run) -> Sizes:
    t = run.cfg.trainer
    return Sizes(t.batch_size, t.samples_per_prompt, t.max_length, t.max_new_tokens, run.state)


def sampling_context(run: Run, prompts: PromptSet, params: SamplingParams) -> SampleContext:
    return SampleContext(
        engine=run.engine,
        models=run.models,
        prompts=prompts,
        params=params,
        tokenizer=run.tokenizer,
        eos_ids=run.eos_ids,
        pad_id=run.pad_id,
        sizes=sizes(run),
        agent=run.agent,
        environment=bool(run.cfg.agent.environment),
        system_prompt=run.cfg.data.system_prompt,
        instruction=run.cfg.data.instruction,
    )


def build_stages(run: Run) -> Stages:
    """Every stage of a step bound to what it needs, from the run's validated config."""
    cfg = run.cfg
    t, ob, smp, lo = cfg.trainer, cfg.reward.overlong_buffer, cfg.sampling, cfg.loss
    params = SamplingParams(
        n=t.samples_per_prompt, temperature=smp.temperature, top_p=smp.top_p, top_k=smp.top_k,
        max_new_tokens=t.max_new_tokens,
    )  # fmt: skip
    fwd = forward_settings(run)
    scoring = ScoreSettings(
        t.samples_per_prompt, response_budget(run), ob.length, ob.penalty, lo.mask_truncated
    )
    one_step = t.ppo_epochs == 1 and t.mini_batch_size == t.batch_size
    preparing = prep.PrepareSettings(fwd, one_step, t.gamma, t.lam, lo.kl.estimator, sizes(run))
    updating = UpdateSettings(
        forward=fwd, ppo_epochs=t.ppo_epochs,
        mini_batch_seqs=t.mini_batch_size * t.samples_per_prompt // dist.world_size(),
        max_response_length=t.max_new_tokens, loss_agg_mode=lo.agg_mode,
        entropy_coef=lo.entropy_coef, vf_coef=lo.vf_coef, value_clip=lo.value_clip,
        max_grad_norm=cfg.optim.max_grad_norm,
    )  # fmt: skip
    return Stages(
        sampler=run.sampler, sampling=sampling_context(run, run.train, params),
        rewards=run.rewards, prompts=run.train, scoring=scoring, models=run.models,
        algo=run.algo, preparing=preparing, updating=updating,
        opts=Optimizers(run.actor_opt, run.actor_sched, run.critic_opt, run.critic_sched),
        kl_ctl=run.kl_ctl, state=run.state, generator=run.update_generator, log=run.log,
        dynamic=run.dynamic, critic_warmup_steps=t.critic_warmup_steps,
        auto_micro_batch=cfg.speed.auto_micro_batch, kl_n_steps=t.batch_size,
    )  # fmt: skip
