"""check_reward_specs: reward names and builtin kwargs checked before anything loads."""

import pytest

from danka.errors import UserError
from danka.rewards import check_reward_specs
from danka.rewards.specs import builtin_kwargs, check_reward_weights
from danka.schema.sections import RewardFunction


def fails(specs) -> UserError:
    with pytest.raises(UserError) as err:
        check_reward_specs(specs)
    assert err.value.exit_code == 2
    return err.value


def test_valid_specs_pass():
    check_reward_specs(
        [
            RewardFunction(name="gsm8k", kwargs={"method": "flexible", "format_score": 0.1}),
            {"name": "format", "kwargs": {"pattern": "####"}},
            RewardFunction(name="length", kwargs={"max_chars": 400}),
            RewardFunction(name="my_rewards.py:score", kwargs={"anything": 1}),  # not loaded
        ]
    )


def test_typo_in_a_builtin_kwarg_names_the_key_the_valid_names_and_a_guess():
    err = fails([RewardFunction(name="gsm8k"), RewardFunction(name="gsm8k", kwargs={"methd": 1})])
    assert err.where == "reward.functions[1].kwargs.methd"
    assert "did you mean 'method'" in err.fix
    assert "method, format_score, score" in err.fix


def test_bad_value_of_a_choice_kwarg():
    err = fails([RewardFunction(name="gsm8k", kwargs={"method": "flexibel"})])
    assert err.where == "reward.functions[0].kwargs.method"
    assert "did you mean 'flexible'" in err.fix and "lenient" in err.fix


def test_unknown_name_uses_the_real_config_key():
    err = fails([RewardFunction(name="gsm8"), RewardFunction(name="math")])
    assert err.where == "reward.functions[0].name"  # never "rewards[0].name"
    assert "did you mean 'gsm8k'" in err.fix and "last_number" in err.fix


def test_missing_name_and_non_mapping_kwargs():
    assert fails([RewardFunction(name="")]).where == "reward.functions[0].name"
    assert fails([{"name": "math", "kwargs": [1]}]).where == "reward.functions[0].kwargs"


def test_every_builtin_lists_its_options():
    # the builtins take no **kwargs: their signatures are the valid option lists
    assert builtin_kwargs("gsm8k") == ["method", "format_score", "score"]
    assert builtin_kwargs("math") == []
    assert builtin_kwargs("format") == ["pattern"]
    assert builtin_kwargs("length") == ["target_chars", "max_chars"]
    assert builtin_kwargs("last_number") == ["only_number_bonus"]
    err = fails([RewardFunction(name="math", kwargs={"timeout": 3})])
    assert "valid options of math: none" in err.fix


@pytest.mark.parametrize("label", ["two words", "", "x" * 65, 3])
def test_a_label_must_be_a_plain_name(label):
    err = fails([RewardFunction(name="gsm8k", label=label)])
    assert err.where == "reward.functions[0].label" and "not a plain name" in str(err)


def test_a_label_used_twice_is_refused():
    specs = [RewardFunction(name="gsm8k", label="strict"), {"name": "math", "label": "strict"}]
    err = fails(specs)
    assert err.where == "reward.functions[1].label" and "used twice" in str(err)


@pytest.mark.parametrize(
    "label", ["error_rate", "zero_adv_groups", "not_applicable", "valid_frac", "env", "overlong"]
)
def test_a_label_that_is_one_of_dankas_own_reward_metrics_is_refused(label):
    """reward/<label> would overwrite danka's own number (or a part danka adds)."""
    err = fails([RewardFunction(name="gsm8k"), RewardFunction(name="math", label=label)])
    assert err.where == "reward.functions[1].label" and "danka's own" in str(err)
    assert "error_rate" in err.fix and "zero_adv_groups" in err.fix and "reward_model" in err.fix


def test_weights_that_overflow_alone_are_refused_naming_the_weight():
    """Two finite weights whose sum is no finite float32 number (training reads the
    combined reward as float32): a reward of 1 from both would be inf."""
    two = [RewardFunction(name="gsm8k", weight=2e38), RewardFunction(name="math", weight=-2e38)]
    with pytest.raises(UserError) as err:
        check_reward_weights(two)
    assert err.value.where == "reward.functions[1].weight" and "3.4e+38" in str(err.value)
    assert "2e+38, -2e+38" in str(err.value)
    with pytest.raises(UserError) as err:  # one weight alone past float32
        check_reward_weights([RewardFunction(name="gsm8k", weight=1e300)])
    assert err.value.where == "reward.functions[0].weight"
    with pytest.raises(UserError) as err:  # past float32 only with the reward model's weight
        check_reward_weights([RewardFunction(name="gsm8k", weight=-2e38)], model_weight=2e38)
    assert err.value.where == "reward.model_weight"
    check_reward_weights([RewardFunction(name="gsm8k", weight=1e38)], model_weight=1e38)
