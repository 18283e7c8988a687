import pytest

from danka.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, Registry
from danka.errors import UserError


def test_register_get_names_contains():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        return "b"

    @reg.register("a")
    def a():
        return "a"

    assert reg.get("a") is a and reg.get("b")() == "b"
    assert reg.names() == ["a", "b"]  # sorted
    assert "a" in reg and "c" not in reg


def test_double_registration_raises():
    reg = Registry("widget")
    reg.register("x")(lambda: 1)
    with pytest.raises(ValueError, match="'x' is already registered"):
        reg.register("x")(lambda: 2)
    assert reg.get("x")() == 1  # the first one stays


def test_unknown_name_lists_valid_names():
    reg = Registry("widget")
    reg.register("alpha")(lambda: 1)
    reg.register("beta")(lambda: 2)
    with pytest.raises(UserError) as info:
        reg.get("gamma", where="config: algorithm.widget")
    err = info.value
    assert err.where == "config: algorithm.widget"
    assert "unknown widget 'gamma'" in str(err)
    assert err.fix == "use one of: alpha, beta"


def test_builtin_registries_hold_the_documented_names():
    assert ADVANTAGE_ESTIMATORS.names() == [
        "dr_grpo",
        "gae",
        "grpo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "rloo",
    ]
    assert POLICY_LOSSES.names() == ["gspo", "vanilla"]
    assert KL_ESTIMATORS.names() == ["abs", "k1", "k2", "k3"]


def test_metadata_answers_which_kind():
    from danka.algorithms.advantages import EstimatorMeta
    from danka.algorithms.kl import KL_MODES

    reg = Registry("widget", EstimatorMeta())
    reg.register("plain")(lambda: 1)
    reg.register("critic", EstimatorMeta(needs_critic=True))(lambda: 2)
    assert reg.meta("plain") == EstimatorMeta() and reg.meta("critic").needs_critic
    with pytest.raises(UserError, match="unknown widget 'x'"):
        reg.meta("x")
    critics = [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.meta(n).needs_critic]
    grouped = [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.meta(n).grouped]
    assert critics == ["gae"]
    assert grouped == ["dr_grpo", "grpo", "reinforce_plus_plus_baseline", "rloo"]
    assert KL_MODES.meta("loss").in_loss and KL_MODES.meta("reward").in_reward
