"""The small builders a run is made of (danka/trainer/build.py puts them together): the
tokenizer, the prompt sets, the rewards, the models, the optimisers and schedules, the
algorithm's registry entries, the KL controller and the engine checks."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from danka import distributed as dist
from danka.agent.loop import AgentLoop
from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
from danka.algorithms.kl import KL_ESTIMATORS, KL_MODES, AdaptiveKLController, FixedKLController
from danka.algorithms.losses import POLICY_LOSSES, PolicyLossParams
from danka.algorithms.rollout_correction import ROLLOUT_CORRECTIONS
from danka.data.template import control_token_warning, encode_prompts
from danka.errors import UserError
from danka.models import varlen
from danka.models.loading import (
    load_causal_lm,
    load_tokenizer,
)
from danka.models.lora import compute_adapters_in
from danka.models.speed import compile_forward, enable_tf32
from danka.rewards.combine import RewardComputer, RewardSpec, build_reward_computer
from danka.rollout.base import ROLLOUT_ENGINES, check_options, engine_meta, options_of
from danka.schema.sections import DankaConfig
from danka.step.agent_rollout import encode_agent_prompts
from danka.step.algorithm import Algorithm
from danka.step.dynamic_sampling import DynamicSampler
from danka.step.heldout import probe_prompts
from danka.step.model_set import build_models
from danka.step.prompt_set import PromptSet
from danka.trainer.optim import build_optimizer, build_scheduler
from danka.types import PromptRow


def encode(cfg: DankaConfig, tokenizer, rows: list[PromptRow], location: str = "data") -> PromptSet:
    d = cfg.data
    enc = encode_prompts(
        tokenizer,
        rows,
        max_prompt_length=d.max_prompt_length,
        policy=d.overlong_prompt,
        system_prompt=d.system_prompt,
        instruction=d.instruction,
        examples=d.examples,
        location=location,
    )
    return PromptSet(rows=enc.rows, texts=enc.texts, ids=enc.input_ids)


def speed_settings(cfg: DankaConfig, models, device: torch.device, log: logging.Logger) -> None:
    """speed.tf32 and speed.compile (CUDA only: UserError elsewhere, never a no-op)."""
    t = cfg.speed
    line = enable_tf32(t.tf32, device)
    if line:
        log.info(line)
    if t.compile:
        compile_forward(models.policy, True, device)
        log.info("speed.compile: the training forwards' decoder layers compiled (torch.compile)")
    if t.cuda_graphs:
        log.info(cuda_graphs_line(t, device))
    if varlen.wanted(t.packed_update, device):
        dtype = next(models.policy.parameters()).dtype
        lora = cfg.lora.enable_lora and dtype in (torch.bfloat16, torch.float16)
        if lora:  # the adapters' matmuls in the base dtype: no fp32 copy of each input
            for model in {id(m): m for m in (models.policy, models.critic_model) if m}.values():
                compute_adapters_in(model, dtype)
        log.info(
            "speed.packed_update: log-prob, value and update forwards padding-free (varlen "
            "attention)"
            + (f", LoRA computed in {str(dtype).removeprefix('torch.')}" if lora else "")
        )


def cuda_graphs_line(t, device: torch.device) -> str:
    """What ``speed.cuda_graphs: true`` does here (the log line); UserError (exit 2) off
    CUDA or without the padding-free forwards it replays, never a silent no-op."""
    cuda = torch.device(device).type == "cuda"
    if not cuda or not varlen.wanted(t.packed_update, device):
        raise UserError(
            "speed.cuda_graphs replays the padding-free forwards on a CUDA GPU; this run has "
            + ("no CUDA GPU" if not cuda else "them off (speed.packed_update: false)"),
            where="speed.cuda_graphs",
            fix="set speed.cuda_graphs: false"
            + ("" if not cuda else ", or speed.packed_update: null"),
        )
    if t.compile:
        return "speed.cuda_graphs: off under speed.compile (its compiled layers run instead)"
    return "speed.cuda_graphs: each micro-batch's decoder body replayed from a CUDA graph"


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


def check_engine(cfg: DankaConfig, name: str) -> None:
    """The trainer's refusals once the plan chose engine ``name`` (before anything is
    sized): every rank on the same engine, ``rollout.*`` settings it would ignore, a
    rollout correction that needs the engine's log-probs."""
    if dist.is_active():
        dist.check_config(cfg, name)
    check_options(name, options_of(cfg.rollout))  # rollout.* the engine ignores: refused now
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
        # the evaluation's drift probe, refused now rather than after the model loads
        probe_prompts(tokenizer, cfg.eval.probe_prompts, cfg.trainer.max_length)
    if len(train.rows) < cfg.trainer.batch_size:
        raise UserError(
            f"only {len(train.rows)} usable training prompts, fewer than "
            f"trainer.batch_size ({cfg.trainer.batch_size})",
            where="data.train_dataset",
            fix="add rows or lower trainer.batch_size",
        )
    return train, held


def control_tokens_warning(cfg: DankaConfig, tokenizer, rows: list[PromptRow]) -> str | None:
    """The one start-up warning for chat control tokens in ``rows`` or data.examples
    (danka.data.template.control_token_warning); None where data.allow_control_tokens."""
    if cfg.data.allow_control_tokens:
        return None
    return control_token_warning(tokenizer, rows, cfg.data.examples)


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
        examples=cfg.data.examples,
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
            # the tutorial's "reward model reuses the actor's weights": the base, adapters off
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


def data_prompt_tokens(cfg: DankaConfig, base_dir, log=None) -> int | None:
    """The longest training prompt of ``cfg``'s data as ``danka train`` encodes it (the
    length the run's plan prices), for ``danka estimate``; None where the data or the
    tokenizer cannot be read here (the plan then prices the config's bound), saying why
    through ``log``, and for a tool or environment rollout (its sequences grow turn by turn:
    the plan prices the bound, danka.planning.memory.prompt_tokens). Nothing is written
    (bad-row reports go to a temporary folder)."""
    import tempfile
    from pathlib import Path

    from danka.data.splits import load_rows

    if cfg.agent.tools or cfg.agent.environment:
        return None
    quiet = logging.getLogger("danka.estimate.data")
    quiet.propagate = False
    if not quiet.handlers:  # once per process, not once per call
        quiet.addHandler(logging.NullHandler())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            train_rows, _ = load_rows(cfg, Path(base_dir), Path(tmp))
        tokenizer = build_tokenizer(cfg, quiet)
        train, _ = build_prompts(cfg, tokenizer, train_rows, [])
    except (UserError, OSError, ValueError) as e:
        if log is not None:
            log(f"prompts priced at the config's bound: the training prompts were not read ({e})")
        return None
    return longest_prompt(train)


def longest_prompt(prompts) -> int | None:
    """Tokens of the longest encoded prompt of a ``PromptSet`` (None without prompts): the
    prompt length the memory plan prices (danka.planning.memory.prompt_tokens)."""
    return max((len(ids) for ids in prompts.ids), default=None)
