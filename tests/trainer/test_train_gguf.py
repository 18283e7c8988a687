"""``danka train`` on a ``.gguf`` model path: full-parameter and LoRA runs save their
checkpoints (a GGUF loaded straight through transformers refused ``save_pretrained``)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from tests.models.test_gguf import write_tiny_gguf

from .conftest import make_config, train_cli


@pytest.mark.parametrize("lora", [False, True])
def test_train_on_a_gguf_path_saves_checkpoints(tmp_path, monkeypatch, lora):
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    config = make_config(
        tmp_path,
        tmp_path / "unused",
        model={"actor_model_name_or_path": str(path), "device": "cpu"},
        trainer={"total_steps": 1, "batch_size": 2, "samples_per_prompt": 2},
        lora={"enable_lora": lora, "lora_r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
    )
    out = tmp_path / "out"
    assert train_cli(config, out) == 0
    ckpt = out / "actor" / "checkpoint_1"
    if lora:
        adapter = json.loads((ckpt / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str(path.resolve())  # what the user named
    else:
        model = AutoModelForCausalLM.from_pretrained(str(ckpt))  # a plain HF folder
        assert model.config.model_type == "llama"
    assert (ckpt / "README.md").is_file()
