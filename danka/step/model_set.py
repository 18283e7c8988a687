"""The models of a run on one device: policy, reference, critic, sharing one base in LoRA mode.

LoRA mode (default): one frozen base; adapter ``default`` is the policy (the actor); for PPO a second
adapter ``critic`` plus a value head on the same base; the reference policy is the base
with adapters disabled, so no second copy of the weights exists.
Full-parameter mode: the policy is the whole model; the reference is a frozen copy
(only when a KL term needs it); the PPO critic is its own model with a value head.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch

from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
from danka.models.lora import add_adapter, apply_lora, reference_mode, set_active
from danka.models.value_head import ValueHead
from danka.schema.sections import DankaConfig


@dataclass
class ModelSet:
    policy: torch.nn.Module
    lora: bool
    value_head: torch.nn.Module | None = None
    critic_model: torch.nn.Module | None = None  # same object as policy in LoRA mode
    reference_copy: torch.nn.Module | None = None  # full-parameter mode only
    actor_params: list[torch.nn.Parameter] = field(default_factory=list)
    critic_params: list[torch.nn.Parameter] = field(default_factory=list)

    @contextlib.contextmanager
    def actor(self):
        if self.lora:
            set_active(self.policy, "default")
        yield self.policy

    @contextlib.contextmanager
    def critic(self):
        if self.lora and self.critic_model is self.policy:
            set_active(self.policy, "critic")
        try:
            yield self.critic_model
        finally:
            if self.lora and self.critic_model is self.policy:
                set_active(self.policy, "default")

    @contextlib.contextmanager
    def reference(self):
        """The reference policy: adapters off (LoRA) or the frozen copy."""
        if self.lora:
            with reference_mode(self.policy):
                yield self.policy
        else:
            yield self.reference_copy


def _lora_kwargs(cfg: DankaConfig) -> dict:
    lo = cfg.lora
    return dict(
        r=lo.lora_r, alpha=lo.lora_alpha, dropout=lo.lora_dropout, target_modules=lo.target_modules
    )


def _enable_checkpointing(model: torch.nn.Module, cfg: DankaConfig) -> None:
    # from_pretrained returns eval mode; HF layers only checkpoint (and LoRA dropout only
    # drops) in train mode, so the trained models are switched to train mode here.
    model.train()
    if not cfg.model.use_gradient_checkpointing:
        return
    reentrant = cfg.model.gradient_checkpointing_kwargs.use_reentrant
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()  # reentrant checkpointing needs a grad-requiring input


def build_models(cfg: DankaConfig, base: torch.nn.Module, load_critic_base, log) -> ModelSet:
    """Wrap ``base`` into the policy (and critic) the algorithm needs.

    ``load_critic_base()`` loads a separate critic base when one is configured.
    """
    needs_critic = ADVANTAGE_ESTIMATORS.meta(cfg.trainer.advantage_estimator).needs_critic
    needs_reference = cfg.loss.kl.coef > 0
    _enable_checkpointing(base, cfg)
    hidden = base.config.hidden_size
    device = next(base.parameters()).device
    if cfg.lora.enable_lora:
        policy = apply_lora(base, adapter_name="default", **_lora_kwargs(cfg))
        log(f"LoRA enabled on {_targets(cfg)}")
        models = ModelSet(policy=policy, lora=True)
        if needs_critic:
            critic_path = cfg.model.critic_model_name_or_path
            if critic_path in (None, "", cfg.model.actor_model_name_or_path):
                add_adapter(policy, "critic", **_lora_kwargs(cfg))
                models.critic_model = policy
                log("critic: LoRA adapter 'critic' + value head on the actor's base")
            else:
                critic_base = load_critic_base()
                _enable_checkpointing(critic_base, cfg)
                models.critic_model = apply_lora(
                    critic_base, adapter_name="critic", **_lora_kwargs(cfg)
                )
                hidden = critic_base.config.hidden_size
                log(f"critic: LoRA on {critic_path} + value head")
        set_active(policy, "default")
        models.actor_params = [p for n, p in policy.named_parameters() if ".default." in n]
        for p in models.actor_params:
            p.requires_grad_(True)
    else:
        for p in base.parameters():
            p.requires_grad_(True)
        models = ModelSet(policy=base, lora=False, actor_params=list(base.parameters()))
        log("LoRA disabled: training all parameters")
        if needs_reference:
            ref = copy.deepcopy(base).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            models.reference_copy = ref
        if needs_critic:
            critic_base = load_critic_base()
            _enable_checkpointing(critic_base, cfg)
            models.critic_model = critic_base
            hidden = critic_base.config.hidden_size
    if needs_critic:
        models.value_head = ValueHead(hidden).to(device)
        critic = models.critic_model
        adapter_params = (
            [p for n, p in critic.named_parameters() if ".critic." in n]
            if cfg.lora.enable_lora
            else list(critic.parameters())
        )
        for p in adapter_params:
            p.requires_grad_(True)
        models.critic_params = adapter_params + list(models.value_head.parameters())
    return models


def _targets(cfg: DankaConfig) -> str:
    tm = cfg.lora.target_modules
    return tm if isinstance(tm, str) else ", ".join(tm)
