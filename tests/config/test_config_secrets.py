"""mask_secrets: credentials never reach config.json, TensorBoard, wandb or MLflow."""

import dataclasses

from danka.schema.secrets import MASK, is_secret_key, mask_secrets
from danka.schema.sections import DankaConfig, RewardFunction


def test_nested_secrets_are_masked_and_the_input_is_untouched():
    cfg = {
        "model": {"actor_model_name_or_path": "m", "hf_token": "hf_abc"},
        "reward": {
            "functions": [
                {"name": "judge.py:score", "kwargs": {"api_key": "sk-123", "temperature": 0}},
                {"name": "x.py:f", "kwargs": {"headers": {"Authorization": "Bearer t"}}},
            ]
        },
        "logging": {"wandb_project": "p", "WANDB_API_KEY": "w", "password": None},
        "extra": ({"secret": "s"}, ["plain"]),
    }
    masked = mask_secrets(cfg)
    assert masked["model"] == {"actor_model_name_or_path": "m", "hf_token": MASK}
    kwargs = masked["reward"]["functions"][0]["kwargs"]
    assert kwargs == {"api_key": MASK, "temperature": 0}
    assert masked["reward"]["functions"][1]["kwargs"]["headers"] == {"Authorization": MASK}
    assert masked["logging"] == {"wandb_project": "p", "WANDB_API_KEY": MASK, "password": None}
    assert masked["extra"] == ({"secret": MASK}, ["plain"])
    assert cfg["reward"]["functions"][0]["kwargs"]["api_key"] == "sk-123"  # not modified


def test_token_counts_and_column_names_are_not_secrets():
    for key in [
        "max_new_tokens",
        "max_prompt_length",
        "eos_token",
        "pad_token_id",
        "tokenizer_kwargs",
        "use_chat_template",
        "answer_key",
        "reward_key",
        "key_column",
        "authors",
    ]:
        assert not is_secret_key(key), key
    for key in ["token", "HF_TOKEN", "apiKey", "openai_key", "aws_secret_access_key", "passwd"]:
        assert is_secret_key(key), key


def test_a_whole_config_dataclass():
    cfg = DankaConfig()
    cfg.reward.functions = [RewardFunction(name="j.py:f", kwargs={"api_token": "t0k"})]
    masked = mask_secrets(cfg)
    assert masked["reward"]["functions"][0]["kwargs"] == {"api_token": MASK}
    # every ordinary field survives unchanged
    plain = dataclasses.asdict(cfg)
    plain["reward"]["functions"][0]["kwargs"]["api_token"] = MASK
    assert masked == plain
