"""What a resume does with a config that changed since the checkpoint (pure logic).

Three kinds of keys:

- **layout** (:data:`LAYOUT_KEYS`): fix which weights the checkpoint holds and what they
  mean (model, LoRA rank/targets/alpha, critic). A change is refused (exit 2): the saved
  adapter would load into a different function (``lora_alpha`` rescales every update).
- **restored hyperparameters** (:data:`APPLIED_KEYS`): learning rates, weight decay and
  the KL controller live in the checkpoint's optimiser/scheduler/controller state; a
  changed value is written into that state after loading (:func:`apply_resume_changes`),
  so the new value is the one used.
- everything else is read from the config at every step: the new value is used.

:func:`describe_changes` gives the "resuming with a changed config" lines, each saying
which value is actually used.
"""

from __future__ import annotations

from typing import Any

from danka.checkpoint.config_diff import _flatten, _fmt, current_layout, diff_configs
from danka.errors import UserError

LAYOUT_KEYS = (
    "model.actor_model_name_or_path",
    "lora.enable_lora",
    "lora.lora_r",
    "lora.lora_alpha",
    "lora.target_modules",
    "model.critic_model_name_or_path",
)
APPLIED_KEYS = (
    "optim.lr",
    "optim.critic_lr",
    "optim.weight_decay",
    "loss.kl.coef",
    "loss.kl.target",
    "loss.kl.horizon",
)


def _get(cfg: dict, dotted: str) -> Any:
    for key in dotted.split("."):
        cfg = cfg.get(key) if isinstance(cfg, dict) else None
    return cfg


def layout(cfg: dict) -> dict[str, Any]:
    """The config values that fix which weights a checkpoint holds and their meaning."""
    out = {
        "model.actor_model_name_or_path": _get(cfg, "model.actor_model_name_or_path"),
        "lora.enable_lora": _get(cfg, "lora.enable_lora"),
    }
    if out["lora.enable_lora"]:
        for key in ("lora.lora_r", "lora.lora_alpha", "lora.target_modules"):
            out[key] = _get(cfg, key)
        if out["lora.lora_alpha"] is not None:
            out["lora.lora_alpha"] = float(out["lora.lora_alpha"])  # 16 == 16.0
    if _get(cfg, "trainer.advantage_estimator") == "gae":  # a critic exists
        out["model.critic_model_name_or_path"] = (
            _get(cfg, "model.critic_model_name_or_path") or out["model.actor_model_name_or_path"]
        )
    return out


def check_layout(old: dict | None, new: dict, where: str) -> None:
    """UserError (exit 2) unless the checkpoint (config ``old``) fits the run ``new``."""
    if not old:
        return
    was, now = layout(old), layout(new)
    if "model.critic_model_name_or_path" in now and "model.critic_model_name_or_path" not in was:
        raise UserError(
            "the checkpoint has no critic, this config trains one "
            f"(trainer.advantage_estimator: {_get(new, 'trainer.advantage_estimator')})",
            where=where,
            fix="resume with the checkpoint's algorithm, or start a new output_dir",
        )
    for key in LAYOUT_KEYS:
        if key not in was or key not in now or was[key] == now[key]:
            continue
        why = " (it scales every LoRA update: alpha / r)" if key == "lora.lora_alpha" else ""
        raise UserError(
            f"checkpoint was trained with {key}={_fmt(was[key])}, this config has "
            f"{_fmt(now[key])}{why}",
            where=where,
            fix=f"set {key} back to {_fmt(was[key])} to resume, or start a new output_dir",
        )


def describe_changes(old: dict, new: dict) -> list[str]:
    """``diff_configs`` lines, each saying which value the resumed run uses."""
    lines = []
    for line in diff_configs(old, new):
        key = line.split(":", 1)[0]
        used = "applied to the restored state" if key in APPLIED_KEYS else "used from now on"
        lines.append(f"{line} ({used})")
    return lines


def _set_lr(opt, sched, new_lr: float) -> None:
    """Rescale the restored optimiser's lr (keeping the schedule's position) and the
    scheduler's base lr to ``new_lr``."""
    base = list(getattr(sched, "base_lrs", [])) if sched is not None else []
    for i, group in enumerate(opt.param_groups):
        old_base = base[i] if i < len(base) else group.get("initial_lr", group["lr"])
        factor = group["lr"] / old_base if old_base else 1.0
        group["lr"] = new_lr * factor
        group["initial_lr"] = new_lr
    if sched is not None:
        sched.base_lrs = [new_lr] * len(opt.param_groups)
        if hasattr(sched, "_last_lr"):
            sched._last_lr = [g["lr"] for g in opt.param_groups]


def apply_resume_changes(old: dict, new: dict, opts: Any, kl_ctl: Any) -> list[str]:
    """Write the changed :data:`APPLIED_KEYS` of ``new`` into the optimisers ``opts`` and
    the KL controller ``kl_ctl`` just restored from a checkpoint whose config was ``old``;
    returns ``"key: old -> new"`` per applied change. ``opts`` (the trainer's
    ``Optimizers``) holds ``actor``, ``actor_sched``, ``critic`` and ``critic_sched`` (None
    where the run has no critic). Call it after they were loaded."""
    actor_opt, actor_sched = opts.actor, opts.actor_sched
    critic_opt, critic_sched = opts.critic, opts.critic_sched
    a, b = _flatten(current_layout(old)), _flatten(current_layout(new))
    applied = []

    def changed(key: str) -> bool:
        return key in a and key in b and a[key] != b[key]

    if changed("optim.lr"):
        _set_lr(actor_opt, actor_sched, float(b["optim.lr"]))
        applied.append("optim.lr")
    if critic_opt is not None and changed("optim.critic_lr"):
        _set_lr(critic_opt, critic_sched, float(b["optim.critic_lr"]))
        applied.append("optim.critic_lr")
    if changed("optim.weight_decay"):
        for opt in (actor_opt, critic_opt):
            for group in opt.param_groups if opt is not None else []:
                group["weight_decay"] = float(b["optim.weight_decay"])
        applied.append("optim.weight_decay")
    if kl_ctl is not None:
        if changed("loss.kl.coef"):  # the adapted value restarts from the new coef
            kl_ctl.value = float(b["loss.kl.coef"])
            applied.append("loss.kl.coef")
        for name in ("target", "horizon"):
            key = f"loss.kl.{name}"
            if changed(key) and hasattr(kl_ctl, name):
                setattr(kl_ctl, name, float(b[key]))
                applied.append(key)
    return [f"{k}: {_fmt(a[k])} -> {_fmt(b[k])}" for k in applied]
