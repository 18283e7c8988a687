"""The stages of one training step, each bound once to exactly what it needs.

``build_stages`` is the only place that reads the config for a step; every stage
function (sample, score, old_and_ref, values, advantages, update) takes its own inputs and
settings and returns a typed record (danka/step/records.py), so a test or a benchmark
builds a stage's inputs directly. Nothing here changes during a run but the objects the
stages train (models, optimisers, the KL controller, the prompt sampler's position): the
micro-batch comes in with each call and an out-of-memory retry hands the smaller one back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import torch

from danka import distributed as dist
from danka.agent.loop import AgentLoop
from danka.models import flops, varlen
from danka.rewards.combine import RewardComputer
from danka.rollout.base import RolloutEngine, SamplingParams
from danka.schema.sections import DankaConfig
from danka.step import prepare as prep
from danka.step.algorithm import Algorithm
from danka.step.answers import SampleContext, sample
from danka.step.dynamic_sampling import DynamicSampler
from danka.step.forward import ForwardSettings, effective_token_ratio
from danka.step.guards import DoesNotFit, OutOfMemory, Sizes, oom_guard
from danka.step.metrics import step_metrics
from danka.step.model_set import ModelSet
from danka.step.prompt_order import PromptSampler
from danka.step.prompt_set import PromptSet
from danka.step.records import (
    OldAndRef,
    OnPolicy,
    Prepared,
    Rollout,
    Scored,
    StepResult,
    UpdateStats,
)
from danka.step.score import ScoreSettings, score
from danka.step.update import NonFiniteError, Optimizers, UpdateSettings, update


@dataclass(frozen=True)
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

    def sample(self, prompt_idx: list[int], micro: int) -> Rollout:
        """Step 2; with ``speed.auto_micro_batch`` an out-of-memory halves the engine's
        sequences per generate call and samples again (kept for the rest of the run; the
        new samples are drawn afresh, so they differ from the ones the first try would have
        given). One group per call that does not fit: the explanation stands."""
        n = self.sampling.params.n
        while True:
            try:
                return sample(self.sampling, prompt_idx, micro)
            except OutOfMemory as err:
                sizes = self.sampling.engine.halve_batch(n, n * len(prompt_idx))
                self._shrunk(err, "rollout", "sequences per generate call", sizes)

    def score(self, rollout: Rollout) -> Scored:
        return score(self.rewards, self.prompts, rollout, self.scoring)

    def old_and_ref(self, scored: Scored, micro: int) -> tuple[OldAndRef, int]:
        """Step 4 at ``micro`` sequences a forward; (its record, the micro-batch it ran at)."""
        return self._retry_micro(
            "logprobs",
            lambda m: prep.old_and_ref(self.models, self.algo, scored, self.preparing, m),
            micro,
        )

    def values(self, scored: Scored, micro: int) -> tuple[torch.Tensor | None, int]:
        """Step 5 at ``micro`` sequences a forward; (the values, the micro-batch it ran at)."""
        return self._retry_micro(
            "values",
            lambda m: prep.values(self.models, self.algo, scored, self.preparing, m),
            micro,
        )

    def advantages(self, scored: Scored, logp: OldAndRef, values) -> Prepared:
        coef = float(self.kl_ctl.value)
        return prep.advantages(self.algo, scored, logp, values, coef, self.preparing)

    def update(self, prepared: Prepared, step: int, micro: int) -> tuple[UpdateStats, int]:
        """Step 7 at ``micro`` sequences a forward/backward; (its stats, the micro-batch it
        ran at). A non-finite loss or gradient skips the optimiser step (reported in the
        stats); an out-of-memory halves the micro-batch and retries (no optimiser step has
        happened yet when a forward/backward runs out). During
        ``trainer.critic_warmup_steps`` only the critic learns. The schedules step either
        way."""
        train_actor = step > self.critic_warmup_steps
        try:
            return self._retry_micro(
                "update",
                lambda m: self.run_update(prepared, m, train_actor=train_actor),
                micro,
                before_retry=self.opts.zero_grad,  # the gradients of the micro-batches that ran
            )
        except NonFiniteError as err:
            return UpdateStats(actor=None, critic=None, skipped=True, reason=str(err)), micro
        finally:
            self.opts.step_schedules()

    def run_update(
        self,
        prepared: Prepared,
        micro: int,
        *,
        train_actor: bool = True,
        dry_run: bool = False,
        generator: torch.Generator | None = None,
    ) -> UpdateStats:
        """The update itself (``dry_run``: the preflight's, weights left alone)."""
        device = next(self.models.policy.parameters()).device
        with oom_guard("update", self.preparing.sizes.at(micro), device):
            return update(
                self.models,
                self.algo,
                self.opts,
                prepared.batch,
                self.updating,
                micro_size=micro,
                kl_coef=float(self.kl_ctl.value),
                generator=generator or self.generator,
                train_actor=train_actor,
                dry_run=dry_run,
            )

    def _retry_micro(self, phase: str, attempt, micro: int, before_retry=None):
        """``(attempt(micro), micro)``; with ``speed.auto_micro_batch`` (the default) an
        out-of-memory halves ``micro`` and runs the phase again, one ``[WARNING]`` per
        halving; the smaller size goes back to the loop, which keeps it for the rest of
        the run. The same numbers up to float rounding: losses are normalised by the
        step's token counts."""
        while True:
            try:
                return attempt(micro), micro
            except OutOfMemory as err:
                if self.auto_micro_batch and before_retry is not None:
                    before_retry()
                sizes = (micro, micro // 2) if micro > 1 else None
                self._shrunk(err, phase, "micro_batch_size", sizes)
                micro //= 2

    def _shrunk(self, err: OutOfMemory, phase: str, what: str, sizes) -> None:
        """After an out-of-memory in ``phase``: with ``speed.auto_micro_batch`` and a size
        that shrank (``sizes``: ``(before, after)`` of ``what``), one warning; else the
        phase's explanation (:class:`OutOfMemory`, exit 3) stands, or where the retries
        shrank as far as they go, :class:`DoesNotFit` (exit 2: the settings do not fit
        the card)."""
        if not self.auto_micro_batch:
            raise err
        if sizes is None:
            context = f"at the smallest {what} the halving retries reach"
            raise DoesNotFit.because(err, context) from None
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

    def metrics(self, result: StepResult) -> dict[str, float]:
        """Step 8's metrics dict (built once, here, from the typed result)."""
        batch = result.scored.batch
        fwd = self.updating.forward
        out = step_metrics(
            result,
            lr=self.opts.actor_sched.get_last_lr()[0],
            kl_coef=float(self.kl_ctl.value),
            packing_ratio=effective_token_ratio(batch, result.micro, fwd.pack_len, fwd.varlen),
        )
        out.update(flops.perf_metrics(self.phase_flops(result), result.seconds, self._peak))
        return out

    @cached_property
    def _counts(self) -> flops.Counts:
        return flops.Counts.of(self.models.policy)

    @cached_property
    def _peak(self) -> float | None:
        return flops.device_peak(next(self.models.policy.parameters()).device)

    def phase_flops(self, result: StepResult) -> dict[str, float]:
        """Model FLOPs of the step's phases on its real tokens (danka.models.flops): what
        the ``perf/*`` metrics divide by the phases' seconds."""
        batch, prepared = result.scored.batch, result.prepared
        if prepared is None:
            return {}
        logp = prepared.old_and_ref
        passes = int(not isinstance(logp.old, OnPolicy)) + int(logp.ref is not None)
        return flops.phase_flops(
            self._counts,
            prompt=float(batch.prompt_mask.sum()),
            response=float(batch.response_mask.sum()),
            sequences=batch.size,
            logprob_passes=passes,
            critic=self.models.value_head is not None,
            full=not self.models.lora,
            epochs=self.updating.ppo_epochs,
            generated=float(result.scored.rollout.generated_tokens),
        )


def forward_settings(
    cfg: DankaConfig, logprob_chunk: int, device=None, seq_tokens: int = 0
) -> ForwardSettings:
    """``device``: where the models are (``speed.packed_update`` null is on for CUDA);
    ``seq_tokens``: the planned tokens of one sequence (a padding-free micro-batch's
    budget is micro_batch_size times it)."""
    sp = cfg.speed
    t = cfg.sampling.temperature
    return ForwardSettings(
        temperature=t if t > 0 else 1.0,
        chunk_size=logprob_chunk,
        pack_len=sp.max_packed_length if sp.packing else None,
        shared_prefix=sp.shared_prefix_forward,
        fused_head=sp.fused_logprob_head,
        varlen=varlen.wanted(sp.packed_update, device or "cpu"),
        seq_tokens=seq_tokens or cfg.trainer.max_length,
        cuda_graphs=sp.cuda_graphs and not sp.compile,
    )


def response_budget(cfg: DankaConfig, agent: AgentLoop | None) -> int:
    """Response tokens a sample may have: trainer.max_new_tokens, or for an agent rollout
    agent.max_total_tokens (all turns and tool responses; 0 = max_new_tokens)."""
    t = cfg.trainer
    return (cfg.agent.max_total_tokens or t.max_new_tokens) if agent else t.max_new_tokens


def sizes(cfg: DankaConfig) -> Sizes:
    t = cfg.trainer
    return Sizes(t.batch_size, t.samples_per_prompt, t.max_length, t.max_new_tokens)


@dataclass(frozen=True)
class Sampling:
    """What a stage samples with, besides the prompts and the settings: the engine, the
    models, the tokenizer's ids and the agent loop of agent.tools / agent.environment."""

    engine: RolloutEngine
    models: ModelSet
    tokenizer: object
    eos_ids: list[int]
    pad_id: int
    agent: AgentLoop | None = None

    def context(self, cfg: DankaConfig, prompts: PromptSet, params: SamplingParams):
        """A :class:`SampleContext` drawing from ``prompts`` with ``params``."""
        return SampleContext(
            engine=self.engine,
            models=self.models,
            prompts=prompts,
            params=params,
            tokenizer=self.tokenizer,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            sizes=sizes(cfg),
            agent=self.agent,
            environment=bool(cfg.agent.environment),
            system_prompt=cfg.data.system_prompt,
            instruction=cfg.data.instruction,
            examples=cfg.data.examples,
        )


@dataclass(frozen=True)
class Trainables:
    """What the update changes, shared with the checkpoint: the optimisers and schedules,
    the KL controller, the prompt sampler, the update's shuffling generator and dynamic
    sampling's leftovers."""

    opts: Optimizers
    kl_ctl: object  # FixedKLController | AdaptiveKLController
    sampler: PromptSampler
    generator: torch.Generator
    dynamic: DynamicSampler | None = None


def build_stages(
    cfg: DankaConfig,
    sampling: Sampling,
    train: PromptSet,
    rewards: RewardComputer,
    algo: Algorithm,
    trainables: Trainables,
    *,
    logprob_chunk: int,
    log: logging.Logger,
    seq_tokens: int = 0,
) -> Stages:
    """Every stage of a step bound to what it needs, from the validated config;
    ``seq_tokens``: the planned tokens of one sequence (:func:`forward_settings`)."""
    t, ob, smp, lo = cfg.trainer, cfg.reward.overlong_buffer, cfg.sampling, cfg.loss
    params = SamplingParams(
        n=t.samples_per_prompt,
        temperature=smp.temperature,
        top_p=smp.top_p,
        top_k=smp.top_k,
        max_new_tokens=t.max_new_tokens,
    )
    device = next(sampling.models.policy.parameters()).device
    fwd = forward_settings(cfg, logprob_chunk, device, seq_tokens)
    scoring = ScoreSettings(
        t.samples_per_prompt,
        response_budget(cfg, sampling.agent),
        ob.length,
        ob.penalty,
        lo.mask_truncated,
    )
    one_step = t.ppo_epochs == 1 and t.mini_batch_size == t.batch_size
    preparing = prep.PrepareSettings(fwd, one_step, t.gamma, t.lam, lo.kl.estimator, sizes(cfg))
    updating = UpdateSettings(
        forward=fwd,
        ppo_epochs=t.ppo_epochs,
        mini_batch_seqs=t.mini_batch_size * t.samples_per_prompt // dist.world_size(),
        max_response_length=t.max_new_tokens,
        loss_agg_mode=lo.agg_mode,
        entropy_coef=lo.entropy_coef,
        vf_coef=lo.vf_coef,
        value_clip=lo.value_clip,
        max_grad_norm=cfg.optim.max_grad_norm,
    )
    tr = trainables
    return Stages(
        sampler=tr.sampler,
        sampling=sampling.context(cfg, train, params),
        rewards=rewards,
        prompts=train,
        scoring=scoring,
        models=sampling.models,
        algo=algo,
        preparing=preparing,
        updating=updating,
        opts=tr.opts,
        kl_ctl=tr.kl_ctl,
        generator=tr.generator,
        log=log,
        dynamic=tr.dynamic,
        critic_warmup_steps=t.critic_warmup_steps,
        auto_micro_batch=cfg.speed.auto_micro_batch,
        kl_n_steps=t.batch_size,
    )
