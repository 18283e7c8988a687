"""Build a ``Run`` from the validated config: device, tokenizer, models, data, rewards."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from danka import distributed as dist
from danka.agent.loop import AgentLoop
from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
from danka.algorithms.kl import KL_ESTIMATORS, KL_MODES, AdaptiveKLController, FixedKLController
from danka.algorithms.losses import POLICY_LOSSES, PolicyLossParams
from danka.algorithms.rollout_correction import ROLLOUT_CORRECTIONS
from danka.config.schema import DankaConfig
from danka.data.formats import Columns, ReadOptions, load_prompt_rows
from danka.data.source import data_line, repeats_warning
from danka.data.tasks import task_rows
from danka.data.template import encode_prompts
from danka.errors import UserError
from danka.lifecycle import compile_forward, enable_tf32
from danka.models.loading import (
    load_causal_lm,
    load_tokenizer,
    pick_device,
    resolve_dtype,
    stop_ids,
)
from danka.planning.engine import choose_engine as choose_rollout_engine
from danka.planning.micro import MicroPlan
from danka.planning.vllm import engine_memory
from danka.rewards.combine import RewardComputer, RewardSpec, build_reward_computer
from danka.rollout.base import (
    ROLLOUT_ENGINES,
    EngineOptions,
    build_engine,
    engine_meta,
)
from danka.trainer.agent import build_agent, encode_agent_prompts
from danka.trainer.budget import memory_budget, planned_sizes
from danka.trainer.dynamic_sampling import DynamicSampler
from danka.trainer.models import build_models
from danka.trainer.optim import build_optimizer, build_scheduler
from danka.trainer.run import Algorithm, PromptSet, Run
from danka.trainer.sampler import PromptSampler
from danka.trainer.state import RunState
from danka.types import PromptRow


def load_rows(cfg: DankaConfig, base_dir: Path, output_dir: Path) -> tuple[list, list]:
    """Training and held-out rows. A task generates both; files are read and split."""
    d = cfg.data
    if d.task:
        seed = cfg.trainer.seed
        kw = d.task_kwargs
        train = task_rows(d.task, d.task_train_size, seed=seed, split="train", kwargs=kw)
        held = []
        if d.eval_size:
            held = task_rows(d.task, d.eval_size, seed=seed, split="test", kwargs=kw)
        return train, held
    cols = Columns(d.format, d.prompt_key, d.response_key, d.reward_key, d.answer_key)
    read = ReadOptions(
        on_bad_row=d.on_bad_row,
        bad_rows_path=output_dir / "bad_rows.jsonl",
        base_dir=base_dir,
        dataset_type=d.dataset_type,
    )
    train = load_prompt_rows(
        d.train_dataset, cols, replace(read, limit=d.limit, split=d.train_split)
    ).rows
    if d.eval_dataset:
        check_eval_source(d, base_dir)
        held = load_prompt_rows(
            d.eval_dataset, cols, replace(read, limit=d.eval_size or None, split=d.eval_split)
        ).rows
        check_no_overlap(train, held, d.eval_dataset)
    elif d.eval_size:
        if d.eval_size >= len(train):
            raise UserError(
                f"data.eval_size ({d.eval_size}) leaves no training rows "
                f"(the file has {len(train)})",
                where="data.eval_size",
                fix="lower data.eval_size or give data.eval_dataset",
            )
        train, held = train[: -d.eval_size], train[-d.eval_size :]
    else:
        held = []
    return train, held


def check_eval_source(d, base_dir: Path) -> None:
    """Held-out data is never silently the training data: the same source read with the
    same split (e.g. a `danka data gsm8k` folder given for both with one split) is refused."""
    same = d.eval_dataset == d.train_dataset or (
        (base_dir / d.eval_dataset).resolve() == (base_dir / d.train_dataset).resolve()
    )
    if same and d.eval_split == d.train_split:
        raise UserError(
            f"data.eval_dataset is data.train_dataset read with the same split "
            f"({d.train_split!r}): the held-out accuracy would be measured on training rows",
            where="data.eval_split",
            fix="give a held-out file, or a folder/hub dataset with another split "
            "(data.eval_split: test), or use data.eval_size to split rows off",
        )


def check_no_overlap(train: list[PromptRow], held: list[PromptRow], where: str) -> None:
    """Exit 2 when a held-out prompt is also a training prompt (same prompt text/messages)."""
    seen = {json.dumps(r.prompt, sort_keys=True) for r in train}
    dup = [r for r in held if json.dumps(r.prompt, sort_keys=True) in seen]
    if dup:
        raise UserError(
            f"{len(dup)} of {len(held)} held-out prompts are also training prompts (first: "
            f"row {dup[0].index}): the held-out accuracy would not be held out",
            where=where,
            fix="remove them from one side, or check data.train_split / data.eval_split",
        )


def encode(cfg: DankaConfig, tokenizer, rows: list[PromptRow], location: str = "data") -> PromptSet:
    d = cfg.data
    enc = encode_prompts(
        tokenizer,
        rows,
        max_prompt_length=d.max_prompt_length,
        policy=d.overlong_prompt,
        system_prompt=d.system_prompt,
        instruction=d.instruction,
        location=location,
    )
    return PromptSet(rows=enc.rows, texts=enc.texts, ids=enc.input_ids)


def reward_specs(cfg: DankaConfig, rows: list[PromptRow]) -> list[RewardSpec]:
    from danka.rewards.builtin import default_reward_for

    specs = [
        RewardSpec(name=f.name, weight=f.weight, kwargs=dict(f.kwargs), label=f.label)
        for f in cfg.reward.functions
    ]
    if specs or cfg.model.reward_model_name_or_path:
        return specs
    source = rows[0].data_source if rows else "unknown"
    default = default_reward_for(source)
    if default is None:
        raise UserError(
            f"no reward configured, and data source {source!r} has no builtin rule reward",
            where="reward.functions",
            fix="add reward.functions: [{name: gsm8k}] (or math, last_number, path.py:function), "
            "or set model.reward_model_name_or_path",
        )
    return [RewardSpec(name=default)]


def build_run(cfg: DankaConfig, base_dir: Path, output_dir: Path, log: logging.Logger) -> Run:
    """Every long-lived object of a run, from small builders. Data, prompts and rule
    rewards are checked before minutes of model loading."""
    t = cfg.trainer
    device = dist.init(pick_device(cfg.model.device))  # cuda:LOCAL_RANK under torchrun
    torch.manual_seed(t.seed)
    train_rows, held_rows = load_rows(cfg, base_dir, output_dir)  # bad rows fail first
    log.info(data_line(cfg, train_rows, held_rows))
    if warning := repeats_warning(train_rows):  # 100k copies of one prompt trained silently
        log.warning(warning)
    budget = memory_budget(cfg, device, log)
    engine_name = choose_engine(cfg, device, log, budget)
    sizes = planned_sizes(cfg, budget, engine=engine_name, base_dir=base_dir, log=log)
    tokenizer = build_tokenizer(cfg, log)
    agent = build_agent(cfg, tokenizer, base_dir)  # None unless rollout.tools / environment
    try:
        return _build_rest(cfg, base_dir, output_dir, log, device, train_rows, held_rows,
                           engine_name, tokenizer, agent, sizes)  # fmt: skip
    except BaseException:
        if agent is not None:  # stop the tool worker process
            agent.close()
        raise


def _build_rest(cfg, base_dir, output_dir, log, device, train_rows, held_rows, engine_name,
                tokenizer, agent, sizes: MicroPlan) -> Run:  # fmt: skip
    """build_run after the agent loop exists (it is closed if this raises)."""
    train, held = build_prompts(cfg, tokenizer, train_rows, held_rows, agent)
    specs = reward_specs(cfg, train.rows)
    rewards = build_rule_rewards(cfg, base_dir, specs, train.rows)
    models, load = build_model_set(cfg, device, log)
    speed_settings(cfg, models, device, log)
    if rewards is None:  # a reward model needs the loaded models (a judge shares the base)
        reward_model = _reward_model(cfg, models, tokenizer, load)
        rewards = build_rule_rewards(cfg, base_dir, specs, train.rows, reward_model)
    engine = build_engine(engine_name, engine_options(cfg, sizes, engine_name, device))
    return assemble_run(
        cfg, models, engine=engine, rewards=rewards, train=train, held=held,
        tokenizer=tokenizer, log=log, base_dir=base_dir, output_dir=output_dir, agent=agent,
        sizes=sizes,
    )  # fmt: skip


def engine_options(
    cfg: DankaConfig, sizes: MicroPlan, engine: str = "", device: torch.device | None = None
) -> EngineOptions:
    """The engine's settings; ``sizes``: the planned generation batch where it is auto; an
    engine with its own memory (vllm) also gets its planned share of ``device``."""
    r = cfg.rollout
    own = {}
    if engine and engine_meta(engine).own_memory and device is not None:
        own = engine_memory(cfg, dict(sizes.planned), device)
    return EngineOptions(
        sizes.value_of(cfg, "rollout.generation_batch_size"),
        keep_cache=r.keep_cache,
        compile=r.compile,
        decode_attention=r.decode_attention,
        shared_prefix=r.shared_prefix,
        lora_compute=r.lora_compute,
        **own,
    )


def assemble_run(
    cfg: DankaConfig,
    models,
    *,
    engine,
    rewards,
    train: PromptSet,
    tokenizer,
    log: logging.Logger,
    held: PromptSet | None = None,
    base_dir: Path | None = None,
    output_dir: Path | None = None,
    agent: AgentLoop | None = None,
    eos_ids: list[int] | None = None,
    pad_id: int | None = None,
    sizes: MicroPlan | None = None,
) -> Run:
    """A ``Run`` around parts already built: the models (``build_model_set`` or
    ``trainer.models.build_models``), a rollout engine, a reward computer (any
    ``rewards(rows, texts, completions) -> RewardOutput``) and the prompt sets. Builds the
    optimisers, schedules, algorithm, KL controller, prompt sampler and state from the
    config. ``build_run`` ends here; benchmarks on random-weight models start here.
    ``sizes``: the planned sizes of the settings that are ``auto`` (without them, auto
    takes the CPU sizes: :func:`planned_sizes` plans for a GPU)."""
    t = cfg.trainer
    if sizes is None:
        sizes = planned_sizes(cfg, None)
    device = next(models.policy.parameters()).device
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
    return Run(
        cfg=cfg, base_dir=base_dir or Path.cwd(), output_dir=output_dir or Path(cfg.output_dir),
        device=device, dtype=resolve_dtype(cfg.model.torch_dtype, device), tokenizer=tokenizer,
        models=models, engine=engine, rewards=rewards, train=train, eval=held,
        algo=build_algorithm(cfg), actor_opt=actor_opt, actor_sched=actor_sched,
        critic_opt=critic_opt, critic_sched=critic_sched, kl_ctl=build_kl_controller(cfg),
        sampler=sampler, log=log,
        state=RunState(total_steps=total, micro_batch_size=sizes.size,
                       logprob_chunk_size=sizes.value_of(cfg, "speed.logprob_chunk_size")),
        update_generator=torch.Generator().manual_seed(t.seed),
        eos_ids=stop_ids(tokenizer) if eos_ids is None else list(eos_ids), pad_id=pad,
        dynamic=build_dynamic_sampler(cfg, pad), agent=agent,
    )  # fmt: skip


def speed_settings(cfg: DankaConfig, models, device: torch.device, log: logging.Logger) -> None:
    """speed.tf32 and speed.compile (CUDA only: UserError elsewhere, never a no-op)."""
    t = cfg.speed
    line = enable_tf32(t.tf32, device)
    if line:
        log.info(line)
    if t.compile:
        compile_forward(models.policy, True, device)
        log.info("speed.compile: policy forward compiled (torch.compile, dynamic=True)")


def build_dynamic_sampler(cfg: DankaConfig, pad_id: int) -> DynamicSampler | None:
    """sampling.dynamic_sampling: DAPO's filter for all-equal groups (one process only:
    ranks that keep different numbers of groups would leave a collective waiting)."""
    t = cfg.trainer
    if not cfg.sampling.dynamic_sampling:
        return None
    if dist.is_active():
        raise UserError(
            "sampling.dynamic_sampling runs in one process only (ranks would keep different "
            "numbers of groups and step out of line)",
            where="sampling.dynamic_sampling",
            fix="train without --nproc, or set sampling.dynamic_sampling: false",
        )
    return DynamicSampler(t.batch_size, cfg.sampling.max_sampling_rounds, pad_id)


def choose_engine(
    cfg: DankaConfig, device: torch.device, log: logging.Logger, budget: int | None = None
) -> str:
    """The rollout engine by its registered capabilities (device, quantised base, the
    log-probs a rollout correction needs); ``budget``: the bytes its memory plan may use."""
    name, reason = choose_rollout_engine(cfg, device, free_bytes=budget)
    if dist.is_active():
        dist.check_config(cfg, name)
    mode = cfg.trainer.rollout_correction.mode
    needs_logprobs = ROLLOUT_CORRECTIONS.get(mode, "trainer.rollout_correction.mode") is not None
    if needs_logprobs and not engine_meta(name).reports_logprobs:
        able = [n for n, _ in ROLLOUT_ENGINES.items() if ROLLOUT_ENGINES.meta(n).reports_logprobs]
        raise UserError(
            f"trainer.rollout_correction.mode {mode} needs the rollout engine's log-probs, "
            f"which the {name!r} engine does not report",
            where="trainer.rollout_correction.mode",
            fix=f"use rollout.engine: {' or '.join(able)} (a GPU), or mode: none",
        )
    log.info(engine_meta(name).banner or f"rollout engine: {name}")
    log.info(f"rollout engine {name}: {reason}")
    return name


def build_tokenizer(cfg: DankaConfig, log: logging.Logger) -> PreTrainedTokenizerBase:
    m = cfg.model
    log.info("Loading tokenizer...")
    return load_tokenizer(
        m.actor_model_name_or_path,
        tokenizer_kwargs=vars(m.tokenizer_kwargs),
        trust_remote_code=m.trust_remote_code,
        log=log.info,
    )


def build_prompts(
    cfg: DankaConfig,
    tokenizer,
    train_rows: list[PromptRow],
    held_rows: list[PromptRow],
    agent: AgentLoop | None = None,
) -> tuple[PromptSet, PromptSet | None]:
    """Encoded prompts; with an agent loop, as chat messages offering its tools."""
    d = cfg.data

    def enc(rows: list[PromptRow], where: str) -> PromptSet:
        if agent is not None:
            return encode_agent_prompts(cfg, agent, tokenizer, rows, where)
        return encode(cfg, tokenizer, rows, where)

    train = enc(train_rows, d.train_dataset or "data.task")
    held = None
    if held_rows:
        held = enc(held_rows, d.eval_dataset or d.train_dataset or "data.task")
    if len(train.rows) < cfg.trainer.batch_size:
        raise UserError(
            f"only {len(train.rows)} usable training prompts, fewer than "
            f"trainer.batch_size ({cfg.trainer.batch_size})",
            where="data.train_dataset",
            fix="add rows or lower trainer.batch_size",
        )
    return train, held


def build_rule_rewards(
    cfg: DankaConfig,
    base_dir: Path,
    specs: list[RewardSpec],
    rows: list[PromptRow],
    reward_model=None,
) -> RewardComputer | None:
    """The reward functions, checked on a few rows; None while a configured reward model
    is not loaded yet."""
    if cfg.model.reward_model_name_or_path and reward_model is None:
        return None
    rewards = build_reward_computer(
        specs,
        base_dir=base_dir,
        timeout_s=cfg.reward.timeout_s,
        on_error=cfg.reward.on_error,
        reward_model=reward_model,
        reward_model_weight=cfg.reward.model_weight,
        system_prompt=cfg.data.system_prompt,  # the RM reads the prompt the policy read
        instruction=cfg.data.instruction,
    )
    rewards.check(rows[:4])
    return rewards


def freeze_quantized_base(model: torch.nn.Module) -> None:
    """Freeze a bitsandbytes base for QLoRA, keeping its bf16 tensors in bf16.

    peft's ``prepare_model_for_kbit_training`` also casts every tensor that is not quantised
    (embeddings, LM head, norms) to fp32: on a 7B base that is ~4 GiB more weights, and the
    fp32 embedding output makes the whole residual stream, activations and KV cache fp32.
    The cast guards fp16 training; bf16 has fp32's range, so only fp16 tensors are cast
    (the LoRA adapters are fp32 either way). Checkpointing is set up by ``build_models``."""
    for p in model.parameters():
        p.requires_grad_(False)
        if p.dtype == torch.float16 and type(p).__name__ != "Params4bit":
            p.data = p.data.float()


def build_model_set(cfg: DankaConfig, device: torch.device, log: logging.Logger):
    """Policy (+ reference, + critic) on ``device``; returns (models, load kwargs)."""
    m = cfg.model
    quantize = "4bit" if m.load_in_4bit else "8bit" if m.load_in_8bit else None
    load = dict(
        dtype=m.torch_dtype,
        device=device,
        attn_implementation=m.attn_implementation,
        trust_remote_code=m.trust_remote_code,
        log=log.info,
    )
    base = load_causal_lm(m.actor_model_name_or_path, quantize=quantize, **load)
    if quantize:
        freeze_quantized_base(base)
    models = build_models(
        cfg,
        base,
        # a full-parameter critic without its own path starts from the actor's weights
        lambda: load_causal_lm(m.critic_model_name_or_path or m.actor_model_name_or_path, **load),
        log.info,
    )
    if dist.is_active():  # before the optimiser: it must hold the sharded parameters
        how = dist.shard_models(models, cfg.backend.fsdp.sharding)
        if how == "sharded":
            log.info(f"FSDP2: policy sharded over {dist.world_size()} processes")
        else:
            why = "weights <= 4 GiB" if cfg.backend.fsdp.sharding == "auto" else "as set"
            log.info(
                f"policy replicated on {dist.world_size()} processes (backend.fsdp.sharding: "
                f"{cfg.backend.fsdp.sharding}, {why}; gradients all-reduced once per step)"
            )
    return models, load


def build_optimizer_and_schedule(cfg: DankaConfig, params, lr: float, total_steps: int):
    opt = build_optimizer(params, lr=lr, weight_decay=cfg.optim.weight_decay)
    sched = build_scheduler(
        opt,
        kind=cfg.optim.lr_scheduler,
        warmup_steps=cfg.optim.warmup_steps,
        total_steps=total_steps,
    )
    return opt, sched


def build_kl_controller(cfg: DankaConfig) -> FixedKLController | AdaptiveKLController:
    kl = cfg.loss.kl
    if kl.adaptive:
        return AdaptiveKLController(kl.coef, kl.target, kl.horizon)
    return FixedKLController(kl.coef)


def build_algorithm(cfg: DankaConfig) -> Algorithm:
    """The registry entries the config names, looked up once."""
    t, lo = cfg.trainer, cfg.loss
    rc = t.rollout_correction
    return Algorithm(
        estimator=ADVANTAGE_ESTIMATORS.get(t.advantage_estimator, "trainer.advantage_estimator"),
        estimator_meta=ADVANTAGE_ESTIMATORS.meta(t.advantage_estimator),
        policy_loss=POLICY_LOSSES.get(lo.policy_loss, "loss.policy_loss"),
        loss_params=PolicyLossParams(
            clip_low=lo.clip_ratio_low,
            clip_high=lo.clip_ratio_high,
            dual_clip_c=lo.dual_clip_c,
            agg_mode=lo.agg_mode,
        ),
        kl_estimator=KL_ESTIMATORS.get(lo.kl.estimator, "loss.kl.estimator"),
        kl_mode=KL_MODES.meta(lo.kl.mode) if lo.kl.coef > 0 else None,
        correction=ROLLOUT_CORRECTIONS.get(rc.mode, "trainer.rollout_correction.mode"),
        correction_cap=float(rc.cap or 0.0),
    )


def _reward_model(cfg: DankaConfig, models, tokenizer, load: dict):
    path = cfg.model.reward_model_name_or_path
    if not path:
        return None
    from danka.rewards.model import ClassifierReward, JudgeReward

    kind = cfg.model.reward_model_type
    same = path == cfg.model.actor_model_name_or_path
    if kind == "judge" or (kind == "auto" and same):
        if same:
            # the seed story's "reward model reuses the actor's weights": the base, adapters off
            return JudgeReward(
                models.policy,
                tokenizer,
                template=cfg.reward.judge_template,
                disable_adapters=models.reference,
            )
        judge = load_causal_lm(path, **load)
        return JudgeReward(judge, load_tokenizer(path), template=cfg.reward.judge_template)
    return ClassifierReward.from_pretrained(
        path, device=load["device"], trust_remote_code=cfg.model.trust_remote_code
    )
