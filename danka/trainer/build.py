"""Everything a run builds once from the validated config, put together: the step's
stages, the evaluation stage, the checkpointer. Nothing built here changes as the run
goes but the objects training changes (models, optimisers, the KL controller, the prompt
sampler's position); what the run's loop changes is its ``RunState`` (danka/trainer/
state.py), which nothing here holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from danka import distributed as dist
from danka.agent.loop import AgentLoop
from danka.config.load import located
from danka.data.source import data_line, repeats_warning
from danka.data.splits import load_rows
from danka.models.loading import pick_device, resolve_dtype, stop_ids
from danka.planning.memory import sequence_tokens
from danka.planning.micro import SizePlan
from danka.planning.run_plan import plan_run, planned_sizes
from danka.rewards.combine import reward_specs
from danka.rollout.base import build_engine, engine_meta, options_of
from danka.schema.sections import DankaConfig
from danka.step.agent_rollout import build_agent
from danka.step.heldout import Evaluator, build_evaluator
from danka.step.prompt_order import PromptSampler
from danka.step.prompt_set import PromptSet
from danka.step.stages import Sampling, Stages, Trainables, build_stages
from danka.step.update import Optimizers
from danka.trainer.components import (
    _reward_model,
    build_algorithm,
    build_dynamic_sampler,
    build_kl_controller,
    build_model_set,
    build_optimizer_and_schedule,
    build_prompts,
    build_rule_rewards,
    build_tokenizer,
    check_engine,
    control_tokens_warning,
    longest_prompt,
    speed_settings,
)
from danka.trainer.saving import Checkpointer


@dataclass(frozen=True)
class Built:
    """What :func:`build` returns: the run's stages, its evaluation (None without held-out
    prompts) and its checkpointer, with the sizes its ``RunState`` starts from."""

    stages: Stages
    evaluator: Evaluator | None
    checkpointer: Checkpointer
    total_steps: int  # trainer.total_steps, or the epochs' steps
    micro: int  # the planned micro-batch (trainer.micro_batch_size, or what auto chose)
    log: logging.Logger
    agent: AgentLoop | None = None  # the multi-turn loop's tool worker, closed at the end

    def close_agent(self) -> None:
        if self.agent is not None:
            self.agent.close()


def build(cfg: DankaConfig, base_dir: Path, output_dir: Path, log: logging.Logger) -> Built:
    """Every long-lived object of a run, from small builders (danka/trainer/components.py).
    Data, prompts and rule rewards are checked before minutes of model loading; a refusal
    that names a bare key (the engine's options, the probe prompts) is said where the user
    wrote it, at the command-line override or the config file's line."""
    with located(cfg):
        return _build(cfg, base_dir, output_dir, log)


def _build(cfg: DankaConfig, base_dir: Path, output_dir: Path, log: logging.Logger) -> Built:
    device = dist.init(pick_device(cfg.model.device))  # cuda:LOCAL_RANK under torchrun
    torch.manual_seed(cfg.trainer.seed)
    train_rows, held_rows = load_rows(cfg, base_dir, output_dir)  # bad rows fail first
    log.info(data_line(cfg, train_rows, held_rows))
    if warning := repeats_warning(train_rows):  # 100k copies of one prompt trained silently
        log.warning(warning)
    tokenizer = build_tokenizer(cfg, log)
    if forged := control_tokens_warning(cfg, tokenizer, train_rows + held_rows):
        log.warning(forged)  # once: the first row or turn holding one, and how many do
    agent = build_agent(cfg, tokenizer, base_dir)  # None unless agent.tools / environment
    try:
        train, held = build_prompts(cfg, tokenizer, train_rows, held_rows, agent)
        plan = plan_run(
            cfg,
            device,
            prompt_tokens=longest_prompt(train),  # the plan prices it + max_new_tokens
            log=log,
            base_dir=base_dir,
            world_size=dist.world_size(),
            check=lambda name: check_engine(cfg, name),
        )
        log.info(engine_meta(plan.engine).banner or f"rollout engine: {plan.engine}")
        log.info(f"rollout engine {plan.engine}: {plan.engine_why}")
        specs = reward_specs(cfg, train.rows)
        rewards = build_rule_rewards(cfg, base_dir, specs, train.rows)
        models, load = build_model_set(cfg, device, log)
        speed_settings(cfg, models, device, log)
        if rewards is None:  # a reward model needs the loaded models (a judge shares the base)
            reward_model = _reward_model(cfg, models, tokenizer, load)
            rewards = build_rule_rewards(cfg, base_dir, specs, train.rows, reward_model)
        options = replace(
            options_of(cfg.rollout),
            generation_batch_size=plan.sizes.generation_batch,
            **plan.engine_memory,
        )
        engine = build_engine(plan.engine, options)
        return assemble(
            cfg,
            models,
            engine=engine,
            rewards=rewards,
            train=train,
            held=held,
            tokenizer=tokenizer,
            log=log,
            output_dir=output_dir,
            agent=agent,
            sizes=plan.sizes,
        )
    except BaseException:
        if agent is not None:  # stop the tool worker process
            agent.close()
        raise


def assemble(
    cfg: DankaConfig,
    models,
    *,
    engine,
    rewards,
    train: PromptSet,
    tokenizer,
    log: logging.Logger,
    held: PromptSet | None = None,
    output_dir: Path | None = None,
    agent: AgentLoop | None = None,
    eos_ids: list[int] | None = None,
    pad_id: int | None = None,
    sizes: SizePlan | None = None,
) -> Built:
    """The run around parts already built: the models (``build_model_set`` or
    ``trainer.models.build_models``), a rollout engine, a reward computer (any
    ``rewards(rows, texts, completions) -> RewardOutput``) and the prompt sets. Builds the
    optimisers, schedules, algorithm, KL controller and prompt sampler from the config and
    binds the stages. :func:`build` ends here; benchmarks on random-weight models start
    here. ``sizes``: the planned sizes of the settings that are ``auto`` (without them,
    auto takes the CPU sizes: danka.planning.run_plan.planned_sizes plans for a GPU)."""
    t = cfg.trainer
    if sizes is None:
        sizes = planned_sizes(cfg, None)
    sampler = PromptSampler(len(train.rows), t.batch_size, seed=t.seed, shuffle=cfg.data.shuffle)
    total = t.total_steps or sampler.steps_per_epoch * t.num_epochs
    o = cfg.optim
    actor_opt, actor_sched = build_optimizer_and_schedule(cfg, models.actor_params, o.lr, total)
    critic_opt = critic_sched = None
    if models.critic_params:
        critic_opt, critic_sched = build_optimizer_and_schedule(
            cfg, models.critic_params, o.critic_lr, total
        )
    pad = tokenizer.pad_token_id if pad_id is None else pad_id
    algo, kl_ctl = build_algorithm(cfg), build_kl_controller(cfg)
    trainables = Trainables(
        opts=Optimizers(actor_opt, actor_sched, critic_opt, critic_sched),
        kl_ctl=kl_ctl,
        sampler=sampler,
        generator=torch.Generator().manual_seed(t.seed),
        dynamic=build_dynamic_sampler(cfg, pad),
    )
    eos = stop_ids(tokenizer) if eos_ids is None else list(eos_ids)
    sampling = Sampling(engine, models, tokenizer, eos, pad, agent)
    stages = build_stages(
        cfg,
        sampling,
        train,
        rewards,
        algo,
        trainables,
        logprob_chunk=sizes.logprob_chunk,
        log=log,
        seq_tokens=sequence_tokens(sizes.sizes),
    )
    evaluator = None
    if held is not None:
        fwd = stages.updating.forward
        per_call = sizes.generation_batch  # rollout.generation_batch_size, auto resolved
        evaluator = build_evaluator(cfg, sampling, held, rewards, fwd, log, per_call)
    device = next(models.policy.parameters()).device
    checkpointer = Checkpointer(
        cfg=cfg,
        output_dir=output_dir or Path(cfg.output_dir),
        log=log,
        models=models,
        opts=trainables.opts,
        kl_ctl=kl_ctl,
        sampler=sampler,
        generator=trainables.generator,
        dtype=resolve_dtype(cfg.model.torch_dtype, device),
        dynamic=trainables.dynamic,
    )
    return Built(stages, evaluator, checkpointer, total, sizes.micro, log, agent)
