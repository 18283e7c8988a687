"""Keys in their older place load as the new key (danka/schema/moved.py): the agent's
settings once under ``rollout``, packing once under ``data``, and the tutorial's retired
``backend`` switches; a resumed run compares an old config.json in the current layout."""

from __future__ import annotations

import pytest

from danka.checkpoint.config_diff import diff_configs
from danka.config import config_to_dict
from danka.config.compat import config_notes
from danka.config.load import config_from_dict
from danka.errors import UserError

BASE = {"model": {"actor_model_name_or_path": "m"}, "data": {"train_dataset": "x.jsonl"}}


def load(extra: dict, overrides=None):
    data = {**BASE, **extra}
    data["data"] = {**BASE["data"], **extra.get("data", {})}
    return config_from_dict(data, overrides)


def test_agent_keys_under_rollout_load_as_the_agent_section():
    old = load({"rollout": {"tools": ["calculator"], "max_turns": 3, "engine": "hf"}})
    new = load({"agent": {"tools": ["calculator"], "max_turns": 3}, "rollout": {"engine": "hf"}})
    assert old.agent.tools == ["calculator"] and old.agent.max_turns == 3
    assert config_to_dict(old) == config_to_dict(new)
    over = load({}, ["rollout.kv_reuse=false", "data.packing=true"])
    assert over.agent.kv_reuse is False and over.speed.packing is True


def test_packing_under_data_loads_as_speed():
    cfg = load({"data": {"packing": True, "max_packed_length": 512}})
    assert (cfg.speed.packing, cfg.speed.max_packed_length) == (True, 512)


def test_both_the_old_and_the_new_key_are_refused():
    with pytest.raises(UserError, match="both rollout.max_turns and agent.max_turns are set"):
        load({"rollout": {"max_turns": 3}, "agent": {"max_turns": 2}})


def test_retired_backend_switches_leave_a_note_or_are_refused():
    cfg = load({"backend": {"fsdp": {"enable_fsdp": False}}})
    assert cfg.rollout.engine == "auto" and len(config_notes(cfg)) == 1
    off = load({"backend": {"hf_transformers": {"enable_hf_transformers": False}}})
    assert off.rollout.engine == "auto" and "rollout.engine decides" in config_notes(off)[0]
    on = load({}, ["backend.hf_transformers.enable_hf_transformers=true"])
    assert on.rollout.engine == "hf"
    with pytest.raises(UserError, match="conflicts with rollout.engine: fast") as err:
        load(
            {"rollout": {"engine": "fast"}}, ["backend.hf_transformers.enable_hf_transformers=true"]
        )
    assert "enable_hf_transformers" in err.value.where
    with pytest.raises(UserError, match="FSDP is not used on one card"):
        load({"backend": {"fsdp": {"enable_fsdp": True}}})


def test_an_old_config_json_compares_in_the_current_layout():
    """A checkpoint's config.json from before the move: its agent keys under rollout, packing
    under data, the backend switches set: no change is reported against the same run now."""
    new = config_to_dict(load({"rollout": {"engine": "hf"}}))
    old = {k: dict(v) if isinstance(v, dict) else v for k, v in new.items()}
    old["rollout"] = {**new["rollout"], **new["agent"], "engine": "auto"}
    del old["agent"]
    old["data"] = {**new["data"], "packing": False, "max_packed_length": 4096}
    old["speed"] = {
        k: v for k, v in new["speed"].items() if k not in ("packing", "max_packed_length")
    }
    old["backend"] = {
        "fsdp": {**new["backend"]["fsdp"], "enable_fsdp": False},
        "vllm": new["backend"]["vllm"],
        "hf_transformers": {"enable_hf_transformers": True},
    }
    assert diff_configs(old, new) == []


def test_both_names_in_a_file_are_located_at_the_older_ones_line(tmp_path):
    """Before: 'config key trainer.lr: both trainer.lr and optim.lr are set', naming no file."""
    from danka.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(
        "model:\n  actor_model_name_or_path: m\ndata:\n  train_dataset: x.jsonl\n"
        "optim:\n  lr: 2.0e-5\ntrainer:\n  lr: 1.0e-5\n"
    )
    with pytest.raises(UserError, match="both trainer.lr and optim.lr are set") as err:
        load_config(path)
    assert err.value.where == f"{path}:8: key trainer.lr", err.value.where
