"""Algorithm presets and names validated against the registries."""

import pytest
import yaml

from danka.cli import main
from danka.config import load_config
from danka.errors import UserError

BASE = ["model.actor_model_name_or_path=m", "data.task=arithmetic"]


def _config(*overrides):
    cfg, _ = load_config(None, BASE + list(overrides))
    return cfg


def test_gspo_gets_the_paper_settings():
    cfg = _config("trainer.algorithm=gspo")
    lo = cfg.loss
    assert (lo.policy_loss, cfg.trainer.advantage_estimator) == ("gspo", "grpo")
    assert (lo.clip_ratio_low, lo.clip_ratio_high) == (3e-4, 4e-4)
    assert lo.agg_mode == "seq-mean-token-mean"


def test_dr_grpo_gets_its_aggregation_and_grpo_keeps_the_defaults():
    assert _config("trainer.algorithm=dr_grpo").loss.agg_mode == "seq-mean-token-sum-norm"
    lo = _config("trainer.algorithm=grpo").loss
    assert (lo.agg_mode, lo.clip_ratio_low, lo.policy_loss) == ("token-mean", 0.2, "vanilla")


def test_explicit_settings_win_over_the_preset(tmp_path):
    lo = _config("trainer.algorithm=gspo", "loss.clip_ratio_high=0.3").loss
    assert lo.clip_ratio_high == 0.3 and lo.clip_ratio_low == 3e-4
    # the older name of the key counts as explicit too
    assert (
        _config("trainer.algorithm=gspo", "trainer.clip_ratio_high=0.3").loss.clip_ratio_high == 0.3
    )
    # a value written in the file wins too, even when it equals the schema default
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"actor_model_name_or_path": "m"}, "data": {"task": "arithmetic"},
        "trainer": {"algorithm": "dr_grpo", "loss_agg_mode": "token-mean"},
    }))  # fmt: skip
    cfg, _ = load_config(path)
    assert cfg.loss.agg_mode == "token-mean"


def test_print_config_shows_the_resolved_preset(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("trainer: {algorithm: gspo}\n")
    code = main(["train", str(path), "--print-config", *BASE])
    shown = yaml.safe_load(capsys.readouterr().out)
    assert code == 0 and shown["loss"]["clip_ratio_low"] == 3e-4
    assert shown["trainer"]["rollout_correction"] == {"mode": "none", "cap": 3.0}


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.advantage_estimator=gea", "trainer.advantage_estimator"),
        ("trainer.algorithm=ppo2", "trainer.algorithm"),
        ("trainer.rollout_correction.mode=tis", "trainer.rollout_correction.mode"),
        ("rollout.engine=sglang", "rollout.engine"),
    ],
)
def test_names_come_from_the_registries(override, key):
    with pytest.raises(UserError) as info:
        load_config(None, BASE + [override])
    assert key in info.value.where and "use one of" in info.value.fix


def test_rollout_correction_caps_and_critic_warmup_checks():
    assert _config("trainer.rollout_correction.mode=seq_mask").trainer.rollout_correction.cap == 2.0
    assert (
        _config("trainer.rollout_correction.mode=token_tis").trainer.rollout_correction.cap == 3.0
    )
    with pytest.raises(UserError, match="must be > 1"):
        _config("trainer.rollout_correction.cap=0.5")
    with pytest.raises(UserError, match="trains no critic"):
        _config("trainer.critic_warmup_steps=2")  # grpo
    assert (
        _config("trainer.algorithm=ppo", "trainer.critic_warmup_steps=2").trainer.samples_per_prompt
        == 1
    )


def test_the_validated_config_is_read_only():
    import copy
    import pickle

    cfg, _ = load_config(None, BASE)
    with pytest.raises(AttributeError, match="read-only after validation"):
        cfg.trainer.micro_batch_size = 1
    with pytest.raises(AttributeError, match="read-only"):
        cfg.loss.kl.coef = 1.0
    what_if = copy.deepcopy(cfg)  # a copy is the caller's to change (danka estimate)
    what_if.trainer.micro_batch_size = 1
    assert cfg.trainer.micro_batch_size == 8
    assert pickle.loads(pickle.dumps(cfg)).optim.lr == cfg.optim.lr
