"""Build a ``Run`` from the validated config: device, tokenizer, models, data, rewards."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from danka import distributed as dist
from danka.algorithms.kl import AdaptiveKLController, FixedKLController
from danka.config.schema import DankaConfig
from danka.data.formats import load_prompt_rows
from danka.data.tasks import arithmetic_rows
from danka.data.template import encode_prompts, render_prompt
from danka.errors import UserError
from danka.models.loading import (
    load_causal_lm,
    load_tokenizer,
    pick_device,
    resolve_dtype,
    stop_ids,
)
from danka.rewards.combine import RewardSpec, build_reward_computer
from danka.rollout.base import build_engine
from danka.trainer.models import build_models
from danka.trainer.optim import build_optimizer, build_scheduler
from danka.trainer.run import PromptSet, Run
from danka.trainer.sampler import PromptSampler
from danka.types import PromptRow


def load_rows(cfg: DankaConfig, base_dir: Path, output_dir: Path) -> tuple[list, list]:
    """Training and held-out rows. A task generates both; files are read and split."""
    d = cfg.data
    if d.task == "arithmetic":
        train = arithmetic_rows(d.task_train_size, seed=cfg.trainer.seed, split="train")
        held = (
            arithmetic_rows(d.eval_size, seed=cfg.trainer.seed, split="test") if d.eval_size else []
        )
        return train, held
    common = dict(
        fmt=d.format,
        prompt_key=d.prompt_key,
        response_key=d.response_key,
        reward_key=d.reward_key,
        answer_key=d.answer_key,
        on_bad_row=d.on_bad_row,
        bad_rows_path=output_dir / "bad_rows.jsonl",
        base_dir=base_dir,
        dataset_type=d.dataset_type,
    )
    train = load_prompt_rows(d.train_dataset, limit=d.limit, **common).rows
    if d.eval_dataset:
        held = load_prompt_rows(d.eval_dataset, limit=d.eval_size or None, **common).rows
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
        RewardSpec(name=f.name, weight=f.weight, kwargs=dict(f.kwargs))
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
    t, m = cfg.trainer, cfg.model
    device = dist.init(pick_device(m.device))  # cuda:LOCAL_RANK under torchrun
    dtype = resolve_dtype(m.torch_dtype, device)
    torch.manual_seed(t.seed)

    # data first: bad rows fail before minutes of model loading
    train_rows, held_rows = load_rows(cfg, base_dir, output_dir)
    engine_name = cfg.rollout.engine
    if engine_name == "auto":
        # the fast engine reads plain weights: a quantised (QLoRA) base generates with HF
        quantised = m.load_in_4bit or m.load_in_8bit
        engine_name = "fast" if device.type == "cuda" and not quantised else "hf"
    if dist.is_active():
        dist.check_config(cfg, engine_name)
    if engine_name == "hf":
        log.info("Using HF Transformers backend for Actor/Critic inference")
    else:
        log.info("Using danka fast rollout engine (static KV cache, CUDA graphs) for inference")

    log.info("Loading tokenizer...")
    tokenizer = load_tokenizer(
        m.actor_model_name_or_path,
        tokenizer_kwargs=vars(m.tokenizer_kwargs),
        trust_remote_code=m.trust_remote_code,
        log=log.info,
    )
    # prompts and rule rewards are checked before minutes of model loading
    train = encode(cfg, tokenizer, train_rows, cfg.data.train_dataset or "data.task")
    held = (
        encode(
            cfg,
            tokenizer,
            held_rows,
            cfg.data.eval_dataset or cfg.data.train_dataset or "data.task",
        )
        if held_rows
        else None
    )
    if len(train.rows) < t.batch_size:
        raise UserError(
            f"only {len(train.rows)} usable training prompts, fewer than "
            f"trainer.batch_size ({t.batch_size})",
            where="data.train_dataset",
            fix="add rows or lower trainer.batch_size",
        )
    specs = reward_specs(cfg, train.rows)
    reward_args = dict(
        base_dir=base_dir,
        timeout_s=cfg.reward.timeout_s,
        on_error=cfg.reward.on_error,
        reward_model_weight=cfg.reward.model_weight,
    )
    rewards = None
    if not m.reward_model_name_or_path:
        rewards = build_reward_computer(specs, **reward_args)
        rewards.check(train.rows[:4])

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
        from peft import prepare_model_for_kbit_training

        base = prepare_model_for_kbit_training(
            base, use_gradient_checkpointing=m.use_gradient_checkpointing
        )
    models = build_models(
        cfg, base, lambda: load_causal_lm(m.critic_model_name_or_path, **load), log.info
    )
    if dist.is_active():  # before the optimiser: it must hold the sharded parameters
        dist.shard_models(models)
        log.info(f"FSDP2: policy sharded over {dist.world_size()} processes")
    if rewards is None:  # a reward model needs the loaded models (a judge shares the base)
        rewards = build_reward_computer(
            specs, reward_model=_reward_model(cfg, models, tokenizer, load), **reward_args
        )
        rewards.check(train.rows[:4])

    sampler = PromptSampler(len(train.rows), t.batch_size, seed=t.seed, shuffle=cfg.data.shuffle)
    total = t.total_steps or sampler.steps_per_epoch * t.num_epochs
    actor_opt = build_optimizer(models.actor_params, lr=t.lr, weight_decay=t.weight_decay)
    sched = dict(kind=t.lr_scheduler, warmup_steps=t.warmup_steps, total_steps=total)
    critic_opt = critic_sched = None
    if models.critic_params:
        critic_opt = build_optimizer(
            models.critic_params, lr=t.critic_lr, weight_decay=t.weight_decay
        )
        critic_sched = build_scheduler(critic_opt, **sched)
    kl_ctl = (
        AdaptiveKLController(t.kl.coef, t.kl.target, t.kl.horizon)
        if t.kl.adaptive
        else FixedKLController(t.kl.coef)
    )
    engine = build_engine(engine_name, batch_size=cfg.rollout.generation_batch_size)
    eos_ids = stop_ids(tokenizer)
    return Run(
        cfg=cfg,
        base_dir=base_dir,
        output_dir=output_dir,
        device=device,
        dtype=dtype,
        tokenizer=tokenizer,
        models=models,
        engine=engine,
        rewards=rewards,
        train=train,
        eval=held,
        actor_opt=actor_opt,
        actor_sched=build_scheduler(actor_opt, **sched),
        critic_opt=critic_opt,
        critic_sched=critic_sched,
        kl_ctl=kl_ctl,
        sampler=sampler,
        log=log,
        total_steps=total,
        update_generator=torch.Generator().manual_seed(t.seed),
        eos_ids=eos_ids,
        pad_id=tokenizer.pad_token_id,
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


__all__ = ["build_run", "render_prompt"]
