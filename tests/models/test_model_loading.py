"""Tokenizer fixing, local-folder loading, dtype resolution, fast failure for unknown Hub ids."""

import pytest
import torch

from danka.errors import UserError
from danka.models import loading, smollm2
from danka.models.loading import (
    end_of_turn_token,
    fix_special_tokens,
    load_causal_lm,
    load_tokenizer,
    resolve_dtype,
    sync_special_tokens,
)
from danka.models.tiny import save_tiny_model, tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


def test_end_of_turn_token_is_im_end_for_chatml():
    assert end_of_turn_token(tiny_tokenizer()) == "<|im_end|>"


def test_end_of_turn_token_for_llama3_style_template():
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|eot_id|>"]})
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|eot_id|>"
        "{% endfor %}"
    )
    assert end_of_turn_token(tok) == "<|eot_id|>"


def test_fix_special_tokens_repairs_gguf_style_tokenizer():
    # transformers 5.17 loads SmolLM2's GGUF with eos=<|im_start|> and no pad
    tok = tiny_tokenizer()
    tok.eos_token = "<|im_start|>"
    tok.pad_token = None
    tok.padding_side = "right"
    changes = fix_special_tokens(tok)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.padding_side == "left"
    assert len(changes) == 3 and "eos_token" in changes[0]
    assert fix_special_tokens(tok) == []  # idempotent


def test_fix_special_tokens_keeps_pad_equal_to_eos():
    # transformers 5.24: eos = pad = <|im_end|>; that is fine and left alone
    tok = tiny_tokenizer()
    tok.pad_token = "<|im_end|>"
    assert fix_special_tokens(tok) == []
    assert tok.pad_token == tok.eos_token == "<|im_end|>"


def test_pad_falls_back_to_eos_without_endoftext():
    tok = tiny_tokenizer()
    tok.pad_token = None
    tok.get_vocab = lambda: {"<|im_end|>": 2}  # pretend <|endoftext|> does not exist
    fix_special_tokens(tok)
    assert tok.pad_token == "<|im_end|>"


def test_sync_special_tokens_updates_model_and_generation_config():
    tok = tiny_tokenizer()
    model = tiny_causal_lm(tok)
    model.config.eos_token_id = model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = None
    changes = sync_special_tokens(model, tok)
    assert model.config.eos_token_id == model.generation_config.eos_token_id == 2
    assert model.generation_config.pad_token_id == 0
    assert len(changes) == 3
    model.generation_config.eos_token_id = [5, 6]  # llama-3 style list: keep it, add eos
    sync_special_tokens(model, tok)
    assert model.generation_config.eos_token_id == [2, 5, 6]


def test_resolve_dtype():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(UserError, match="auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", "cpu")


def test_load_local_folder(tiny_dir):
    lines = []
    tok = load_tokenizer(str(tiny_dir), log=lines.append)
    model = load_causal_lm(str(tiny_dir), dtype="bfloat16", log=lines.append)
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config._attn_implementation == "sdpa"
    assert f"Loaded model {tiny_dir} with bfloat16" in lines
    # same weights as the in-memory model it was saved from
    ref = tiny_causal_lm(tiny_tokenizer(), arch="qwen2")
    torch.testing.assert_close(
        model.lm_head.weight.float(), ref.lm_head.weight.bfloat16().float(), atol=0, rtol=0
    )


def test_flash_attention_without_package_is_user_error(tiny_dir, monkeypatch):
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install danka\[flash\]"):
        load_causal_lm(str(tiny_dir), attn_implementation="flash_attention_2", log=print)


def test_missing_local_path_is_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_causal_lm(str(tmp_path / "nope"), log=print)
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer(str(tmp_path / "model.gguf"), log=print)


def test_unknown_hub_id_fails_fast_when_offline(monkeypatch):
    # This machine has no route to the Hub; force the probe result so the test is the same
    # everywhere. "Fast" = transformers is never asked to fetch the id (that path retries an
    # unreachable host for ~25 s per file).
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=5.0: False)
    calls = []
    monkeypatch.setattr(
        loading.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: calls.append(a)
    )
    with pytest.raises(UserError) as info:
        load_causal_lm("no-such-org/no-such-model-xyz", log=print)
    assert calls == []
    text = str(info.value)
    assert "no-such-org/no-such-model-xyz" in text
    assert "pass a local folder path, or set HF_HOME" in text


def test_hub_probe_is_quick_and_boolean():
    assert loading.hub_reachable(timeout=2.0) in (True, False)


def test_smollm2_id_matching():
    assert smollm2.is_smollm2_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert smollm2.is_smollm2_id("smollm2-135m-instruct")
    assert not smollm2.is_smollm2_id("HuggingFaceTB/SmolLM2-360M-Instruct")
