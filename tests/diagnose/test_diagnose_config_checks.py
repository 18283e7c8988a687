"""Start-up checks on the resolved config alone."""

from danka.diagnose import config_findings


def _cfg(trainer=None, lora=True, **sections) -> dict:
    base = {"algorithm": "grpo", "advantage_estimator": "grpo", "batch_size": 32,
            "mini_batch_size": 32, "ppo_epochs": 1, "lr": 1e-5}  # fmt: skip
    return {"trainer": {**base, **(trainer or {})}, "lora": {"enable_lora": lora}, **sections}


def _ids(cfg: dict) -> set[str]:
    return {f.id for f in config_findings(cfg)}


def test_default_grpo_config_has_no_finding():
    assert _ids(_cfg()) == set()


def test_clip_higher_with_one_optimizer_step_cannot_act():
    # ppo_epochs 1 x 32 / 32 = 1 optimizer step per rollout: pi / pi_old = 1 exactly
    [f] = config_findings(_cfg({"clip_ratio_high": 0.28}))
    assert f.id == "clip_cannot_act" and f.severity == "problem" and f.step is None
    assert "loss.clip_ratio_high: 0.28" in f.evidence and "mini_batch_size" in f.fix
    # two optimizer steps (mini-batch 16 of 32) or two epochs: the clip acts
    assert _ids(_cfg({"clip_ratio_high": 0.28, "mini_batch_size": 16})) == set()
    assert _ids(_cfg({"clip_ratio_high": 0.28, "ppo_epochs": 2})) == set()
    # null mini_batch_size means batch_size
    assert _ids(_cfg({"clip_ratio_high": 0.28, "mini_batch_size": None})) == {"clip_cannot_act"}


def test_gspo_clip_and_ppo_value_clip_with_one_step():
    gspo = {"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
    assert _ids(_cfg(gspo)) == {"clip_cannot_act"}
    ppo = {"algorithm": "ppo", "advantage_estimator": "gae", "value_clip": 0.5}
    [f] = config_findings(_cfg(ppo))
    assert "loss.value_clip: 0.5" in f.evidence


def test_kl_off_with_high_lora_lr_is_a_risk():
    [f] = config_findings(_cfg({"lr": 1e-4, "kl": {"coef": 0.0}}))
    assert f.id == "kl_off_high_lr" and f.severity == "risk" and "LoRA" in f.evidence
    assert _ids(_cfg({"lr": 1e-4, "kl": {"coef": 0.001}})) == set()
    assert _ids(_cfg({"lr": 5e-5})) == set()
    # full fine-tuning: the line is at 1e-5
    assert _ids(_cfg({"lr": 1e-5}, lora=False)) == {"kl_off_high_lr"}


def test_adaptive_kl_from_zero_and_unused_critic_settings():
    assert _ids(_cfg({"kl": {"adaptive": True, "coef": 0.0}})) == {"kl_adaptive_from_zero"}
    assert _ids(_cfg({"kl": {"adaptive": True, "coef": 0.01}})) == set()
    [f] = config_findings(_cfg({"critic_lr": 1e-4, "lam": 0.9}))
    assert f.id == "critic_settings_unused" and "optim.critic_lr: 0.0001" in f.evidence
    ppo = {"algorithm": "ppo", "advantage_estimator": "gae", "critic_lr": 1e-4, "lam": 0.9}
    assert _ids(_cfg(ppo)) == set()


def test_reward_settings_that_config_load_refuses_today():
    """A run from before the label and weight checks: its label took danka's own metric
    name (reward/error_rate read the term's mean), or its weights summed to inf."""
    label = {"reward": {"functions": [{"name": "gsm8k", "label": "error_rate"}]}}
    [f] = config_findings(_cfg(**label))
    assert f.id == "reward_settings_refused" and f.severity == "problem"
    assert "reward.functions[0].label" in f.evidence and "error_rate" in f.evidence
    weights = {"reward": {"functions": [{"name": "gsm8k", "weight": 1e38}] * 4}}
    [f] = config_findings(_cfg(**weights))
    assert "reward.functions[3].weight" in f.evidence and "weights" in f.fix
    fine = {"reward": {"functions": [{"name": "gsm8k", "label": "strict", "weight": 2.0}]}}
    assert _ids(_cfg(**fine)) == set()
