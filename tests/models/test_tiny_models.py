"""Offline tiny tokenizer/model helpers and the benchmark configs."""

from transformers import AutoModelForCausalLM, AutoTokenizer

from danka.models.tiny import (
    qwen2_0_5b_config,
    qwen2_7b_config,
    save_tiny_model,
    tiny_causal_lm,
    tiny_tokenizer,
)


def test_tiny_tokenizer_round_trip_and_chat_template():
    tok = tiny_tokenizer()
    assert len(tok) == 259  # 3 specials + 256 bytes
    assert (tok.pad_token, tok.eos_token) == ("<|endoftext|>", "<|im_end|>")
    ids = tok("héllo<|im_end|>").input_ids
    assert ids[-1] == 2 and len(ids) == 7  # é is two bytes
    assert tok.decode(ids) == "héllo<|im_end|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tiny_model_is_deterministic_and_saves(tmp_path):
    a, b = tiny_causal_lm(seed=1), tiny_causal_lm(seed=1)
    assert all((p == q).all() for p, q in zip(a.parameters(), b.parameters()))
    folder = save_tiny_model(tmp_path / "m", arch="qwen2")
    assert (folder / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert model.config.model_type == "qwen2" and tok.eos_token == "<|im_end|>"


def test_benchmark_configs_have_real_shapes():
    small, big = qwen2_0_5b_config(), qwen2_7b_config()
    assert (small.hidden_size, small.num_hidden_layers, small.vocab_size) == (896, 24, 151936)
    assert small.tie_word_embeddings and not big.tie_word_embeddings
    assert (big.hidden_size, big.num_hidden_layers, big.num_key_value_heads) == (3584, 28, 4)
