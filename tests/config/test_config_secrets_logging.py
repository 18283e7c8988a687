"""Secrets (keys named like token/key/secret/password) are masked wherever a config is
logged: checkpoint config.json and the trackers (TensorBoard text; wandb/MLflow get the
same masked dict from build_trackers)."""

from __future__ import annotations

import json
import logging

from danka.checkpoint import save_checkpoint
from danka.logging import trackers
from danka.schema.secrets import mask_secrets
from danka.schema.sections import LoggingConfig

CONFIG = {
    "reward": {
        "functions": [{"name": "judge.py:score", "kwargs": {"api_key": "sk-live-123", "n": 2}}]
    },
    "data": {"prompt_key": "question", "hf_token": "hf_abc"},
    "logging": {"password": "pw", "wandb_project": "p"},
}


def test_mask_secrets_masks_by_key_name_at_any_depth():
    masked = mask_secrets(CONFIG)
    assert masked["reward"]["functions"][0]["kwargs"] == {"api_key": "***", "n": 2}
    assert masked["data"] == {"prompt_key": "question", "hf_token": "***"}  # *_key columns stay
    assert masked["logging"] == {"password": "***", "wandb_project": "p"}
    assert CONFIG["data"]["hf_token"] == "hf_abc"  # the input is not changed


def test_checkpoint_config_json_is_masked(tmp_path):
    state = save_checkpoint(
        tmp_path, 1, {}, trainer_state={}, config_hash="h", keep_last=None, config=CONFIG
    )
    text = (state / "config.json").read_text()
    assert "sk-live-123" not in text and "hf_abc" not in text and '"pw"' not in text
    assert json.loads(text)["reward"]["functions"][0]["kwargs"]["n"] == 2


def test_trackers_get_the_masked_config(tmp_path, monkeypatch):
    seen = {}

    class Fake:
        def __init__(self, log_dir, config):
            seen["config"] = config

    monkeypatch.setattr(trackers, "TensorBoardTracker", Fake)
    trackers.build_trackers(
        tmp_path,
        LoggingConfig(tensorboard=True),
        run_name="r",
        config=CONFIG,
        log=logging.getLogger("t"),
    )
    assert "sk-live-123" not in json.dumps(seen["config"])
    assert seen["config"]["reward"]["functions"][0]["kwargs"]["api_key"] == "***"
