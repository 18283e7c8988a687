"""Start-up checks: what the resolved config alone says, before any model loads.

A setting that cannot act in the chosen configuration is a problem (the user asked for
something that silently does nothing); a combination known to invite collapse is a risk.
"""

from __future__ import annotations

from danka.diagnose.findings import CHECKS, CheckMeta, Finding
from danka.diagnose.record import RunRecord
from danka.diagnose.series import g
from danka.diagnose.settings import (
    chosen,
    has_critic,
    key,
    optimizer_steps_per_rollout,
    setting,
)
from danka.errors import UserError
from danka.rewards.specs import check_reward_labels, check_reward_weights

# LoRA at lr >= 1e-4 with no KL anchor: verl's LoRA recipes use 3e-6..3e-5 and TRL's GRPO
# default is 1e-6; at 1e-4 a small policy leaves its base within tens of steps and nothing
# pulls it back (both shipped GSM8K examples collapsed to formatted guesses so).
LORA_LR_RISK = 1e-4
# Full fine-tuning moves every weight: the same drift comes ten times sooner (verl's full
# recipes use 1e-6).
FULL_LR_RISK = 1e-5


@CHECKS.register("clip_cannot_act", CheckMeta(reads="config"))
def clip_cannot_act(rec: RunRecord, at: int) -> Finding | None:
    """With one optimizer step per rollout the policy that is trained IS the policy that
    sampled, at its only step: pi/pi_old = 1 exactly on every token, so no clip bound
    (PPO's, clip-higher, dual clip, GSPO's) and no value clip can ever be active. A rollout
    correction does not change that: it re-weights by pi_old/pi_rollout, another ratio."""
    c = rec.config
    if optimizer_steps_per_rollout(c) != 1:
        return None
    names = ["clip_ratio_low", "clip_ratio_high", "dual_clip_c"]
    if has_critic(c):
        names.append("value_clip")
    set_ = [n for n in names if chosen(c, n)]
    if not set_:
        return None
    shown = ", ".join(f"{key(n)}: {setting(c, n)}" for n in set_)
    return Finding(
        "clip_cannot_act",
        "a clip setting cannot act: there is one optimizer step per rollout, so the ratio is "
        "exactly 1",
        f"{shown}; {key('ppo_epochs')}: {setting(c, 'ppo_epochs')}, "
        f"{key('mini_batch_size')}: {setting(c, 'mini_batch_size') or setting(c, 'batch_size')}"
        f" = {key('batch_size')}: {setting(c, 'batch_size')}",
        f"for the clip to act, take several optimizer steps per rollout ({key('mini_batch_size')}"
        f" below {key('batch_size')}, or {key('ppo_epochs')} > 1); otherwise remove the setting",
    )


@CHECKS.register("kl_off_high_lr", CheckMeta(reads="config", severity="risk"))
def kl_off_high_lr(rec: RunRecord, at: int) -> Finding | None:
    c = rec.config
    lr, lora = float(setting(c, "lr")), bool(setting(c, "lora"))
    limit = LORA_LR_RISK if lora else FULL_LR_RISK
    if float(setting(c, "kl_coef") or 0) > 0 or lr < limit:
        return None
    return Finding(
        "kl_off_high_lr",
        "no KL to the reference policy with a high learning rate: nothing keeps the policy "
        "near its base",
        f"{key('kl_coef')}: {setting(c, 'kl_coef')}, {key('lr')}: {g(lr)} with "
        f"{'LoRA' if lora else 'full fine-tuning'} (>= {g(limit)})",
        f"set {key('kl_coef')}: 0.001 (a reference model is kept), or lower {key('lr')} to "
        f"{'1e-5..3e-5 (verl LoRA recipes)' if lora else '1e-6 (verl full recipes)'}",
    )


@CHECKS.register("kl_adaptive_from_zero", CheckMeta(reads="config"))
def kl_adaptive_from_zero(rec: RunRecord, at: int) -> Finding | None:
    """The adaptive controller multiplies its coefficient (value *= 1 + e * n / horizon):
    started at 0 it stays 0."""
    c = rec.config
    if not setting(c, "kl_adaptive") or float(setting(c, "kl_coef") or 0) > 0:
        return None
    return Finding(
        "kl_adaptive_from_zero",
        "the adaptive KL controller cannot act: it scales a coefficient that starts at 0",
        f"{key('kl_adaptive')}: true, {key('kl_coef')}: {setting(c, 'kl_coef')}",
        f"set {key('kl_coef')} to a starting value (e.g. 0.001), or turn {key('kl_adaptive')} off",
    )


@CHECKS.register("critic_settings_unused", CheckMeta(reads="config"))
def critic_settings_unused(rec: RunRecord, at: int) -> Finding | None:
    """Only GAE builds a critic; its settings (and GAE's lambda) do nothing elsewhere."""
    c = rec.config
    if has_critic(c):
        return None
    set_ = [n for n in ("critic_lr", "value_clip", "vf_coef", "lam") if chosen(c, n)]
    if not set_:
        return None
    shown = ", ".join(f"{key(n)}: {setting(c, n)}" for n in set_)
    return Finding(
        "critic_settings_unused",
        "critic settings cannot act: this algorithm has no critic",
        f"{shown} with {key('algorithm')}: {setting(c, 'algorithm')}",
        f"remove them, or use {key('algorithm')}: ppo (a critic with GAE)",
    )


@CHECKS.register("reward_settings_refused", CheckMeta(reads="config"))
def reward_settings_refused(rec: RunRecord, at: int) -> Finding | None:
    """A run started before danka refused these at start-up, judged by the checks config
    load runs (danka.rewards.specs): a label that took one of danka's own reward names
    (reward/<label> then held the term's mean, not danka's number), or weights whose sizes
    pass float32's range (the combined reward inf, every update skipped)."""
    c = rec.config
    rm = setting(c, "reward_model_weight") if setting(c, "reward_model") else None
    try:
        functions = list(setting(c, "reward_functions") or [])
        check_reward_labels(functions)
        check_reward_weights(functions, rm)
    except UserError as err:
        return Finding(
            "reward_settings_refused",
            "a reward setting danka refuses at start-up today: this run's reward numbers "
            "cannot be trusted",
            f"{err.where}: {err.what}",
            err.fix or "",
        )
    except (TypeError, ValueError):  # a config.json danka did not write: other checks say
        return None
    return None
