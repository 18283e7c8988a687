"""config_hash is order-independent; diff_configs lists changed leaves with dotted keys."""

from __future__ import annotations

from danka.checkpoint import config_hash, diff_configs


def test_config_hash_stable_and_sensitive():
    a = {"trainer": {"lr": 1e-5, "steps": 10}, "model": {"name": "x"}}
    b = {"model": {"name": "x"}, "trainer": {"steps": 10, "lr": 1e-5}}
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 16
    assert config_hash(a) != config_hash({**a, "trainer": {"lr": 2e-5, "steps": 10}})


def test_diff_configs():
    old = {"trainer": {"lr": 1e-5, "steps": 10, "gone": True}, "model": {"name": "x"}, "w": None}
    new = {"trainer": {"lr": 2e-5, "steps": 10, "new": [1, 2]}, "model": {"name": "y"}, "w": None}
    # keys in their older place (trainer.lr) are compared in the current layout (optim.lr)
    assert diff_configs(old, new) == [
        "model.name: x -> y",
        "optim.lr: 1e-5 -> 2e-5",
        "trainer.gone: True -> <unset>",
        "trainer.new: <unset> -> [1, 2]",
    ]
    assert diff_configs(old, {**new, "trainer": {"steps": 10}, "optim": {"lr": 1e-5}}) == [
        "model.name: x -> y",
        "trainer.gone: True -> <unset>",
    ]
    assert diff_configs(old, old) == []
