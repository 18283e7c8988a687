"""Save / verify / load round trip, corruption detection, incomplete checkpoints, keep_last."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from danka.checkpoint import (
    checkpoint_parts,
    config_hash,
    find_latest_checkpoint,
    load_checkpoint_config,
    load_trainer_state,
    save_checkpoint,
    verify_checkpoint,
)
from danka.errors import UserError


def _writer(files: dict[str, bytes]):
    def write(folder: Path) -> None:
        for name, data in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)

    return write


def _save(out: Path, step: int, keep_last: int | None = None) -> Path:
    writers = {
        "actor": _writer({"adapter_model.safetensors": b"A" * 100 + bytes([step])}),
        "critic": _writer({"value_head.safetensors": b"V" * 10, "sub/x.json": b"{}"}),
    }
    state = {"step": step, "lr": 1e-5, "order": [3, 1, 2], "t": torch.arange(4.0) * step}
    return save_checkpoint(
        out, step, writers, trainer_state=state, config_hash="abc", keep_last=keep_last
    )


def test_round_trip(tmp_path):
    config = {"trainer": {"lr": 1e-5}, "model": "tiny"}
    state = {
        "step": 7,
        "optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"lr": 0.1}]},
        "kl_ctl": {"value": 0.05},
        "name": "run",
    }
    writers = {"actor": _writer({"adapter_model.safetensors": b"weights"})}
    state_dir = save_checkpoint(
        tmp_path,
        7,
        writers,
        trainer_state=state,
        config_hash=config_hash(config),
        keep_last=None,
        config=config,
    )
    assert state_dir == tmp_path / "state" / "checkpoint_7"
    manifest = verify_checkpoint(state_dir)
    assert manifest.step == 7 and manifest.config_hash == config_hash(config)
    assert set(manifest.parts) == {"actor", "state"}
    actor_files = manifest.parts["actor"]["files"]
    assert actor_files["adapter_model.safetensors"]["size"] == len(b"weights")
    loaded = load_trainer_state(state_dir)
    assert loaded["step"] == 7 and loaded["name"] == "run" and loaded["kl_ctl"]["value"] == 0.05
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], torch.ones(3))
    assert load_checkpoint_config(state_dir) == config
    parts = checkpoint_parts(state_dir)
    assert parts["actor"] == (tmp_path / "actor" / "checkpoint_7").resolve()
    assert (parts["actor"] / "adapter_model.safetensors").read_bytes() == b"weights"
    assert find_latest_checkpoint(tmp_path) == state_dir
    assert not list(tmp_path.glob("*/.tmp-*"))


def test_trainer_state_with_code_is_rejected(tmp_path):
    """weights_only loading refuses arbitrary pickled objects."""
    state_dir = save_checkpoint(
        tmp_path, 1, {}, trainer_state={"fn": Path("x")}, config_hash="h", keep_last=None
    )
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        load_trainer_state(state_dir)


@pytest.mark.parametrize("damage", ["truncate", "modify", "delete"])
def test_damaged_file_is_detected(tmp_path, damage):
    state_dir = _save(tmp_path, 3)
    f = tmp_path / "actor" / "checkpoint_3" / "adapter_model.safetensors"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:50])
    elif damage == "modify":
        data = bytearray(f.read_bytes())
        data[0] ^= 1
        f.write_bytes(bytes(data))
    else:
        f.unlink()
    with pytest.raises(UserError) as err:
        verify_checkpoint(state_dir)
    text = str(err.value)
    assert "incomplete or corrupted" in text and "adapter_model.safetensors" in text
    assert "--resume auto" in text
    if damage == "modify":
        assert "expected sha256" in text and "found" in text
    assert find_latest_checkpoint(tmp_path) is None


def test_latest_skips_checkpoint_without_manifest(tmp_path, caplog):
    _save(tmp_path, 1)
    second = _save(tmp_path, 2)
    (second / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="danka.checkpoint"):
        assert find_latest_checkpoint(tmp_path) == tmp_path / "state" / "checkpoint_1"
    assert "checkpoint_2" in caplog.text
    with pytest.raises(UserError, match="no manifest.json"):
        verify_checkpoint(second)


def test_latest_orders_steps_numerically(tmp_path):
    for step in (2, 10, 9):
        _save(tmp_path, step)
    assert find_latest_checkpoint(tmp_path).name == "checkpoint_10"
    assert find_latest_checkpoint(tmp_path / "nothing-here") is None


def test_keep_last(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep_last=2)
    for part in ("actor", "critic", "state"):
        names = sorted(p.name for p in (tmp_path / part).iterdir())
        assert names == ["checkpoint_3", "checkpoint_4"], part
    # a stale temporary folder from a crash is removed by the next save
    (tmp_path / "actor" / ".tmp-checkpoint_5-deadbeef").mkdir()
    _save(tmp_path, 5, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "actor").iterdir()) == [
        "checkpoint_4",
        "checkpoint_5",
    ]


def test_keep_last_never_deletes_the_new_one(tmp_path):
    """Saving an older step (resume from an explicit path) keeps it even with keep_last=1."""
    _save(tmp_path, 5)
    _save(tmp_path, 3, keep_last=1)
    assert (tmp_path / "state" / "checkpoint_3" / "manifest.json").exists()
    verify_checkpoint(tmp_path / "state" / "checkpoint_3")


def test_replaces_older_crashed_attempt(tmp_path, monkeypatch):
    """A crash after the parts were renamed but before the manifest leaves an incomplete
    checkpoint_2; the next attempt at step 2 replaces it and is complete."""
    import danka.checkpoint.store as store

    _save(tmp_path, 1)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_write_manifest", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(
            tmp_path,
            2,
            {"actor": _writer({"old.bin": b"old"})},
            trainer_state={"step": 2},
            config_hash="h",
            keep_last=None,
        )
    monkeypatch.undo()
    assert find_latest_checkpoint(tmp_path).name == "checkpoint_1"
    _save(tmp_path, 2)
    latest = find_latest_checkpoint(tmp_path)
    assert latest.name == "checkpoint_2"
    assert not (tmp_path / "actor" / "checkpoint_2" / "old.bin").exists()
    manifest = json.loads((latest / "manifest.json").read_text())
    assert manifest["step"] == 2 and set(manifest["parts"]) == {"actor", "critic", "state"}


def test_failing_writer_leaves_no_temp_folder(tmp_path):
    def boom(folder: Path) -> None:
        (folder / "half").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_checkpoint(
            tmp_path, 1, {"actor": boom}, trainer_state={}, config_hash="h", keep_last=None
        )
    assert not list(tmp_path.glob("*/.tmp-*"))
    assert find_latest_checkpoint(tmp_path) is None


def test_peft_adapter_round_trip(tmp_path):
    """An actor writer calling save_pretrained gives a folder PeftModel.from_pretrained loads."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    base = GPT2LMHeadModel(cfg)
    model = get_peft_model(
        base, LoraConfig(r=2, target_modules=["c_attn"], init_lora_weights=False)
    )
    state_dir = save_checkpoint(
        tmp_path,
        1,
        {"actor": model.save_pretrained},
        trainer_state={},
        config_hash="h",
        keep_last=1,
    )
    actor_dir = checkpoint_parts(state_dir)["actor"]
    assert (actor_dir / "adapter_model.safetensors").exists()
    assert (actor_dir / "adapter_config.json").exists()
    torch.manual_seed(0)
    reloaded = PeftModel.from_pretrained(GPT2LMHeadModel(cfg), actor_dir)
    ids = torch.tensor([[1, 2, 3]])
    model.eval()
    reloaded.eval()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reloaded(ids).logits)
