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
from danka.config.schema import DankaConfig
from danka.data.source import data_line, repeats_warning
from danka.data.splits import load_rows
from danka.models.loading import pick_device, resolve_dtype, stop_ids
from danka.planning.memory import sequence_tokens
from danka.planning.micro import SizePlan
from danka.planning.shape import ModelShape
from danka.planning.vllm import engine_memory
from danka.rewards.combine import reward_specs
from danka.rollout.base import EngineOptions, build_engine, engine_meta, options_of
from danka.trainer.agent import build_agent
from danka.trainer.budget import longest_prompt, memory_budget, model_shape, planned_sizes
from danka.trainer.checkpointing import Checkpointer
from danka.trainer.evaluate import Evaluator, build_evaluator
from danka.trainer.run import PromptSet
from danka.trainer.sampler import PromptSampler
from danka.trainer.setup import (
    _reward_model,
    build_algorithm,
    build_dynamic_sampler,
    build_kl_controller,
    build_model_set,
    build_optimizer_and_schedule,
    build_prompts,
    build_rule_rewards,
    build_tokenizer,
    choose_engine,
    control_tokens_warning,
    speed_settings,
)
from danka.trainer.stages import Sampling, Stages, Trainables, build_stages
from danka.trainer.update import Optimizers


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

    def close(self) -> None:
        """Stop the reward workers (and the tool worker, when there is one)."""
        self.stages.rewards.close()
        self.close_agent()

    def close_agent(self) -> None:
        if self.agent is not None:
            self.agent.close()


def build(cfg: DankaConfig, base_dir: Path, output_dir: Path, log: logging.Logger) -> Built:
    """Every long-lived object of a run, from small builders (danka/trainer/setup.py).
    Data, prompts and rule rewards are checked before minutes of model loading."""
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
        budget = memory_budget(cfg, device, log)
        shape = model_shape(cfg, base_dir) if budget is not None else None  # read once
        longest = longest_prompt(train)  # the plan prices this prompt + max_new_tokens
        engine_name = choose_engine(cfg, device, log, budget, shape, longest)
        sizes = planned_sizes(cfg, budget, engine=engine_name, shape=shape, base_dir=base_dir,
                              log=log, prompt_tokens=longest)  # fmt: skip
        specs = reward_specs(cfg, train.rows)
        rewards = build_rule_rewards(cfg, base_dir, specs, train.rows)
        models, load = build_model_set(cfg, device, log)
        speed_settings(cfg, models, device, log)
        if rewards is None:  # a reward model needs the loaded models (a judge shares the base)
            reward_model = _reward_model(cfg, models, tokenizer, load)
            rewards = build_rule_rewards(cfg, base_dir, specs, train.rows, reward_model)
        engine = build_engine(engine_name, engine_options(cfg, sizes, engine_name, device, shape))
        return assemble(
            cfg, models, engine=engine, rewards=rewards, train=train, held=held,
            tokenizer=tokenizer, log=log, output_dir=output_dir, agent=agent, sizes=sizes,
        )  # fmt: skip
    except BaseException:
        if agent is not None:  # stop the tool worker process
            agent.close()
        raise


def engine_options(
    cfg: DankaConfig,
    sizes: SizePlan,
    engine: str = "",
    device: torch.device | None = None,
    shape: ModelShape | None = None,
) -> EngineOptions:
    """The engine's settings; ``sizes``: the planned generation batch where it is auto; an
    engine with its own memory (vllm) also gets its planned share of ``device`` for a model
    of ``shape``."""
    own = {}
    if engine and engine_meta(engine).own_memory and device is not None:
        if shape is None:  # no budget was planned (the shape was not read yet)
            shape = model_shape(cfg)
        if shape is not None:
            own = engine_memory(cfg, sizes.sizes, shape, device)
    return replace(options_of(cfg.rollout), generation_batch_size=sizes.generation_batch, **own)


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
    auto takes the CPU sizes: danka.trainer.budget.planned_sizes plans for a GPU)."""
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
        opts=Optimizers(actor_opt, actor_sched, critic_opt, critic_sched), kl_ctl=kl_ctl,
        sampler=sampler, generator=torch.Generator().manual_seed(t.seed),
        dynamic=build_dynamic_sampler(cfg, pad),
    )  # fmt: skip
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
        evaluator = build_evaluator(cfg, sampling, held, rewards, fwd, log)
    device = next(models.policy.parameters()).device
    checkpointer = Checkpointer(
        cfg=cfg, output_dir=output_dir or Path(cfg.output_dir), log=log, models=models,
        opts=trainables.opts, kl_ctl=kl_ctl, sampler=sampler, generator=trainables.generator,
        dtype=resolve_dtype(cfg.model.torch_dtype, device), dynamic=trainables.dynamic,
    )  # fmt: skip
    return Built(stages, evaluator, checkpointer, total, sizes.micro, log, agent)
