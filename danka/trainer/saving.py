"""What a danka checkpoint holds, and putting it back.

``actor/checkpoint_N`` is a PEFT adapter (``PeftModel.from_pretrained`` loads it) or, in
full-parameter mode, a full safetensors model; ``critic/checkpoint_N`` the critic adapter
and ``value_head.safetensors``; ``state/checkpoint_N`` optimiser, schedulers, every RNG,
the data position and the KL controller. The crash-safe writing is danka.checkpoint's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from danka import distributed as dist
from danka.checkpoint import (
    capture_rng_state,
    checkpoint_parts,
    load_checkpoint_config,
    load_trainer_state,
    restore_rng_state,
    save_checkpoint,
    verify_checkpoint,
)
from danka.checkpoint.resume_changes import (
    apply_resume_changes,
    check_layout,
    describe_changes,
)
from danka.errors import UserError, library_errors
from danka.lifecycle import check_run_lock
from danka.model_card import hub_ready_writers
from danka.models.value_head import load_value_head, save_value_head
from danka.schema.secrets import mask_secrets
from danka.schema.sections import DankaConfig
from danka.step.dynamic_sampling import DynamicSampler
from danka.step.model_set import ModelSet
from danka.step.prompt_order import PromptSampler
from danka.step.update import Optimizers

ADAPTER_FILE = "adapter_model.safetensors"


def _save_adapter(model, adapter: str, folder: Path, full: dict | None = None) -> None:
    state = get_peft_model_state_dict(model, state_dict=full, adapter_name=adapter)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, folder / ADAPTER_FILE)
    model.peft_config[adapter].save_pretrained(str(folder))


def _writers(models: ModelSet, full: dict | None = None, critic_full: dict | None = None) -> dict:
    """``full`` / ``critic_full``: the policy's / critic's gathered state dicts (several
    processes), else the live ones."""
    if models.lora:
        writers = {"actor": lambda d: _save_adapter(models.policy, "default", d, full)}
    else:
        writers = {
            "actor": lambda d: models.policy.save_pretrained(
                d, state_dict=full, safe_serialization=True
            )
        }
    if models.value_head is not None:

        def critic(d: Path) -> None:
            if models.lora:
                _save_adapter(models.critic_model, "critic", d, critic_full)
            else:
                models.critic_model.save_pretrained(
                    d, state_dict=critic_full, safe_serialization=True
                )
            save_value_head(models.value_head, d)

        writers["critic"] = critic
    return writers


def _load_adapter(model, adapter: str, folder: Path, where: Path) -> None:
    file = folder / ADAPTER_FILE
    if not file.is_file():
        raise UserError(
            "checkpoint has no adapter weights",
            where=str(folder),
            fix="resume from a checkpoint written by danka train",
        )
    state = load_file(str(file))
    if dist.is_active():  # sharded model: load full tensors through torch.distributed
        unexpected = dist.load_full_state_dict(model, _with_adapter_name(state, adapter))
    else:
        result = set_peft_model_state_dict(model, state, adapter_name=adapter)
        unexpected = getattr(result, "unexpected_keys", []) or []
    if unexpected:
        raise UserError(
            f"the adapter in {folder} does not fit this model ({len(unexpected)} unexpected "
            f"weights, e.g. {unexpected[0]})",
            where=str(where),
            fix="resume with the model and lora settings the checkpoint was trained with",
        )


def _with_adapter_name(state: dict, adapter: str) -> dict:
    """PEFT's saved keys (``...lora_A.weight``) as the model names them (``...lora_A.default.weight``)."""
    out = {}
    for key, value in state.items():
        for part in (".lora_A.", ".lora_B."):
            if part in key and not key.split(part, 1)[1].startswith(f"{adapter}."):
                key = key.replace(part, f"{part}{adapter}.", 1)
        out[key] = value
    return out


def check_compatible(state_dir: Path, resolved: dict) -> None:
    """UserError unless the checkpoint's weights fit the run ``resolved`` describes (same
    model, LoRA rank/alpha/targets, critic); cheap (reads config.json), so it runs before
    model loading. Other changes are allowed: :func:`restore` applies and reports them."""
    old = load_checkpoint_config(state_dir)
    was = (old or {}).get("model", {}).get("actor_model_name_or_path")
    now = resolved["model"]["actor_model_name_or_path"]
    if old and was != now:
        raise UserError(
            f"checkpoint was trained on {was!r}, this config uses {now!r}",
            where=str(state_dir),
            fix="set model.actor_model_name_or_path to the checkpoint's model",
        )
    check_layout(old, resolved, where=str(state_dir))


@dataclass(frozen=True)
class Checkpointer:
    """Step 9 bound to what a checkpoint holds: the models, the optimisers and schedules,
    the KL controller, the prompt sampler, dynamic sampling's leftovers and the update's
    generator (shared with the stages, which train them), plus where and how to write."""

    cfg: DankaConfig
    output_dir: Path
    log: logging.Logger
    models: ModelSet
    opts: Optimizers
    kl_ctl: object  # FixedKLController | AdaptiveKLController
    sampler: PromptSampler
    generator: torch.Generator
    dtype: torch.dtype
    dynamic: DynamicSampler | None = None

    def save(self, step: int, history: dict, resolved: dict, config_hash: str) -> Path | None:
        """Write checkpoint ``step`` (every rank gathers, rank 0 writes); its path, None on
        other ranks."""
        o, models = self.opts, self.models
        full, actor_opt = None, o.actor.state_dict()
        critic_full, critic_opt = None, o.critic.state_dict() if o.critic else None
        if dist.is_active():  # gather on every rank (collective), write on rank 0 only
            full = dist.full_state_dict(models.policy)
            actor_opt = dist.full_optimizer_state(o.actor)
            if o.critic is not None:
                critic_full, critic_opt = dist.full_critic_state(models, o.critic, full)
            if not dist.is_main():
                return None
        # the output dir may have been deleted and taken by another run since we locked it
        check_run_lock(self.output_dir, what=f"checkpoint {step}")
        state = {
            "step": step,
            "actor_opt": actor_opt,
            "actor_sched": o.actor_sched.state_dict(),
            "critic_opt": critic_opt,
            "critic_sched": o.critic_sched.state_dict() if o.critic_sched else None,
            "rng": capture_rng_state(),
            "update_generator": self.generator.get_state(),
            "sampler": self.sampler.state_dict(),
            "kl_ctl": self.kl_ctl.state_dict(),
            "dynamic_sampler": self.dynamic.state_dict() if self.dynamic is not None else None,
            "history": history,
            "model": self.cfg.model.actor_model_name_or_path,
        }
        writers = _writers(models, full, critic_full)
        path = save_checkpoint(
            self.output_dir,
            step,
            hub_ready_writers(writers, self.cfg, step, history, models.lora),
            trainer_state=state,
            config_hash=config_hash,
            config=resolved,  # masked by save_checkpoint
            keep_last=self.cfg.checkpoint.keep_last,
        )
        self.log.info(f"checkpoint saved: {self.output_dir / 'actor' / f'checkpoint_{step}'}")
        return path

    def restore(self, state_dir: Path, resolved: dict) -> tuple[int, dict]:
        """Load every part of the checkpoint at ``state_dir``; returns (step, history)."""
        verify_checkpoint(state_dir)
        check_compatible(state_dir, resolved)
        parts = checkpoint_parts(state_dir)
        state = load_trainer_state(state_dir)
        old_cfg = load_checkpoint_config(state_dir) or {}
        new_cfg = mask_secrets(resolved)  # the checkpoint's copy is masked too
        model = self.cfg.model.actor_model_name_or_path
        if state.get("model") != model:
            raise UserError(
                f"checkpoint was trained on {state.get('model')!r}, this config uses {model!r}",
                where=str(state_dir),
                fix="set model.actor_model_name_or_path to the checkpoint's model",
            )
        # why: a checkpoint without config.json, or a layout check missed a case; torch's
        # message (size mismatch, missing keys) is kept, its traceback is not
        with library_errors(
            (RuntimeError, ValueError, KeyError),
            "the checkpoint does not fit this model or config",
            where=str(state_dir),
            fix="resume with the model, lora and algorithm settings the checkpoint "
            "was trained with, or start a new output_dir",
        ):
            self._load_parts(parts, state, state_dir)
        if old_cfg:
            apply_resume_changes(old_cfg, new_cfg, self.opts, self.kl_ctl)
            changes = describe_changes(old_cfg, new_cfg)
            if changes:
                self.log.warning("resuming with a changed config: " + "; ".join(changes))
        return int(state["step"]), state.get("history") or {"eval": []}

    def _load_parts(self, parts: dict[str, Path], state: dict, state_dir: Path) -> None:
        models, o = self.models, self.opts
        if models.lora:
            _load_adapter(models.policy, "default", parts["actor"], state_dir)
        else:
            dist.load_full_model(models.policy, parts["actor"], self.dtype)
        if models.value_head is not None:
            if models.lora:
                _load_adapter(models.critic_model, "critic", parts["critic"], state_dir)
            else:
                dist.load_full_model(models.critic_model, parts["critic"], self.dtype)
            head = load_value_head(parts["critic"], models.value_head.hidden_size)
            models.value_head.load_state_dict(head.state_dict())
        dist.load_optimizer_state(o.actor, state["actor_opt"])
        o.actor_sched.load_state_dict(state["actor_sched"])
        if o.critic is not None and state.get("critic_opt"):
            dist.load_optimizer_state(o.critic, state["critic_opt"])
            o.critic_sched.load_state_dict(state["critic_sched"])
        restore_rng_state(state["rng"])
        self.generator.set_state(state["update_generator"])
        self.sampler.load_state_dict(state["sampler"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        if self.dynamic is not None and state.get("dynamic_sampler"):
            self.dynamic.load_state_dict(state["dynamic_sampler"])
