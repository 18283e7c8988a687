"""Resume with a changed config: lr / weight decay / KL settings are applied to the restored
state (old code kept the checkpoint's values while the warning printed the new ones);
lora_alpha joins the layout check; the message says which value is used."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from danka.algorithms.kl import AdaptiveKLController
from danka.checkpoint.resume_changes import apply_resume_changes, check_layout, describe_changes
from danka.errors import UserError


def _cfg(lr=1e-5, wd=0.0, coef=0.1, target=0.1, horizon=10000, alpha=16, r=8, critic_lr=1e-5):
    return {
        "model": {"actor_model_name_or_path": "m", "critic_model_name_or_path": None},
        "lora": {"enable_lora": True, "lora_r": r, "lora_alpha": alpha, "target_modules": ["q"]},
        "trainer": {
            "advantage_estimator": "gae",
            "lr": lr,
            "critic_lr": critic_lr,
            "weight_decay": wd,
            "batch_size": 4,
            "kl": {"coef": coef, "target": target, "horizon": horizon, "adaptive": True},
        },
    }


def _state(actor_opt, actor_sched, critic_opt=None, critic_sched=None, kl_ctl=None):
    """The restored parts of a run: its optimisers (as ``Optimizers`` holds them) and its
    KL controller, the arguments after the two configs."""
    opts = SimpleNamespace(
        actor=actor_opt, actor_sched=actor_sched, critic=critic_opt, critic_sched=critic_sched
    )
    return opts, kl_ctl


def _restored(lr: float, wd: float):
    """An optimiser + warm-up scheduler as restored from a checkpoint at step 2 of a
    4-step linear warm-up: lr = base * (2 + 1) / 4."""
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=lr, weight_decay=wd)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    for _ in range(2):
        opt.step()
        sched.step()
    return opt, sched


def test_changed_lr_weight_decay_and_kl_are_applied():
    old, new = _cfg(), _cfg(lr=2e-5, wd=0.01, coef=0.2, target=0.05, horizon=500)
    opt, sched = _restored(1e-5, 0.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-5 * 3 / 4)
    kl = AdaptiveKLController(0.1, 0.1, 10000)
    kl.value = 0.137  # adapted during the first run
    lines = apply_resume_changes(old, new, *_state(opt, sched, kl_ctl=kl))
    assert lines == [
        "optim.lr: 1e-5 -> 2e-5",
        "optim.weight_decay: 0.0 -> 0.01",
        "loss.kl.coef: 0.1 -> 0.2",
        "loss.kl.target: 0.1 -> 0.05",
        "loss.kl.horizon: 10000 -> 500",
    ]
    # the schedule keeps its position: 2e-5 * 3/4 now, and 2e-5 * 4/4 after the next step
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-5 * 3 / 4)
    assert opt.param_groups[0]["weight_decay"] == 0.01
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-5)
    assert (kl.value, kl.target, kl.horizon) == (0.2, 0.05, 500.0)


def test_unchanged_config_changes_nothing():
    opt, sched = _restored(1e-5, 0.0)
    kl = AdaptiveKLController(0.1, 0.1, 10000)
    kl.value = 0.137
    assert apply_resume_changes(_cfg(), _cfg(), *_state(opt, sched, kl_ctl=kl)) == []
    assert kl.value == 0.137  # the adapted value is kept
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-5 * 3 / 4)


def test_critic_lr_applied_to_the_critic_optimiser():
    opt, sched = _restored(1e-5, 0.0)
    copt, csched = _restored(1e-5, 0.0)
    lines = apply_resume_changes(
        _cfg(), _cfg(critic_lr=4e-5), *_state(opt, sched, critic_opt=copt, critic_sched=csched)
    )
    assert lines == ["optim.critic_lr: 1e-5 -> 4e-5"]
    assert copt.param_groups[0]["lr"] == pytest.approx(4e-5 * 3 / 4)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-5 * 3 / 4)


def test_lora_alpha_is_part_of_the_compatibility_check():
    check_layout(_cfg(), _cfg(lr=3e-5), where="ckpt")  # other changes are fine
    check_layout(_cfg(alpha=16), _cfg(alpha=16.0), where="ckpt")  # 16 == 16.0
    with pytest.raises(UserError) as err:
        check_layout(_cfg(alpha=16), _cfg(alpha=32), where="ckpt")
    assert "lora.lora_alpha=16.0" in str(err.value) and "set lora.lora_alpha back" in str(err.value)
    with pytest.raises(UserError, match="lora.lora_r"):
        check_layout(_cfg(r=8), _cfg(r=16), where="ckpt")


def test_change_message_says_which_value_is_used():
    lines = describe_changes(_cfg(), _cfg(lr=2e-5) | {"x": 1})
    assert "optim.lr: 1e-5 -> 2e-5 (applied to the restored state)" in lines
    assert "x: <unset> -> 1 (used from now on)" in lines
