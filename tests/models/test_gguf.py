"""GGUF in and out: a ``.gguf`` path becomes a plain (saveable) HF model, converted once;
``write_gguf`` writes a file transformers reads back to the same logits and token ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from danka.errors import UserError
from danka.models import gguf, loading
from danka.models.gguf_export import write_gguf
from danka.models.tiny import tiny_causal_lm, tiny_tokenizer

TEXT = "<|im_start|>user\nWhat is 47 + 38? wörld<|im_end|>\n"


def write_tiny_gguf(path: Path, *, arch: str = "llama", out_type: str = "f32", seed: int = 0):
    """A tiny random model (danka.models.tiny) as a GGUF file, written by the gguf package."""
    tok = tiny_tokenizer()
    model = tiny_causal_lm(tok, arch=arch, seed=seed)
    return write_gguf(model, tok, path, out_type=out_type, log=lambda s: None), model, tok


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(("out_type", "atol"), [("f32", 0.0), ("f16", 2e-3), ("q8_0", 3e-2)])
def test_write_gguf_round_trips_through_transformers(tmp_path, arch, out_type, atol):
    path, model, tok = write_tiny_gguf(tmp_path / "m.gguf", arch=arch, out_type=out_type)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name)
    back_tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ids = tok(TEXT)["input_ids"]
    assert back_tok(TEXT)["input_ids"] == ids
    assert back_tok.eos_token == "<|im_end|>"
    assert back_tok.chat_template == tok.chat_template
    with torch.no_grad():
        a = model(torch.tensor([ids])).logits
        b = back(torch.tensor([ids])).logits
    assert (a - b).abs().max().item() <= atol
    import gguf as gguf_py

    types = {t.name: t.tensor_type.name for t in gguf_py.GGUFReader(str(path)).tensors}
    assert types["blk.0.attn_q.weight"] == out_type.upper()
    assert types["blk.0.attn_norm.weight"] == "F32"  # norms stay f32, as llama.cpp writes them


def test_write_gguf_refuses_unknown_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=259))
    with pytest.raises(UserError, match="does not know the architecture 'gpt2'"):
        write_gguf(model, tiny_tokenizer(), tmp_path / "m.gguf")


def test_gguf_path_loads_as_a_plain_saveable_model_converted_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    path, model, tok = write_tiny_gguf(tmp_path / "files" / "tiny.gguf")
    lines: list[str] = []
    net = loading.load_causal_lm(str(path), dtype="float32", log=lines.append)
    assert any("Converting tiny.gguf" in x for x in lines)
    assert getattr(net, "hf_quantizer", None) is None
    net.save_pretrained(str(tmp_path / "saved"))  # GGUF-tagged models refuse this
    assert (tmp_path / "saved" / "model.safetensors").is_file()
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(net(ids).logits, model(ids).logits)
    converted = gguf.cache_dir_for(path)
    marker = json.loads((converted / gguf.MARKER).read_text())
    assert marker["source"] == str(path.resolve())
    lines.clear()
    tok2 = loading.load_tokenizer(str(path), log=lines.append)  # the cached folder, no work
    assert not any("Converting" in x for x in lines)
    assert tok2(TEXT)["input_ids"] == tok(TEXT)["input_ids"]


def test_the_converted_folder_follows_the_one_file_mode_rule(tmp_path, monkeypatch):
    """A conversion is written by a run or command like its other files: what a new file
    or folder gets from the umask (0644 / 0755 under 022), so a cache others share
    ($DANKA_CACHE) is readable by them; safetensors' 0600 and mkdtemp's 0700 were not."""
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    old = os.umask(0o022)
    try:
        target = gguf.ensure_converted(path, log=lambda s: None)
    finally:
        os.umask(old)
    assert oct(target.stat().st_mode & 0o777) == "0o755"
    files = {p.name: oct(p.stat().st_mode & 0o777) for p in target.rglob("*")}
    assert "model.safetensors" in files and set(files.values()) == {"0o644"}, files


def test_a_changed_gguf_file_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0)
    first = gguf.cache_dir_for(path)
    write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)
    assert gguf.cache_dir_for(path) != first


def test_missing_or_unreadable_gguf_is_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="does not exist"):
        loading.load_causal_lm(str(tmp_path / "nope.gguf"), log=print)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(UserError, match="cannot read the GGUF file"):
        loading.load_causal_lm(str(bad), log=print)
    assert not any((tmp_path / "cache" / "models").iterdir())  # no half conversion left


def test_a_gguf_path_loads_as_a_reward_classifier_backbone(tmp_path, monkeypatch):
    """danka rm / danka distill --student X.gguf: the same one-time conversion."""
    from danka.models.classifier import load_score_model

    monkeypatch.setenv("DANKA_CACHE", str(tmp_path / "cache"))
    path, _, tok = write_tiny_gguf(tmp_path / "tiny.gguf")
    model, tokenizer = load_score_model(str(path))
    assert model.config.num_labels == 1 and tokenizer(TEXT)["input_ids"] == tok(TEXT)["input_ids"]
