"""Offline tiny models and tokenizers for tests, and real-shape configs for GPU benchmarks.

Nothing here downloads: the tokenizer is byte-level (256 byte tokens + 3 ChatML specials),
built with the ``tokenizers`` library; models are random-weight transformers from a config.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

# Same ids as SmolLM2: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# SmolLM2-135M-Instruct's ChatML template (default system prompt shortened).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: ids 0-2 are the ChatML specials, 3-258 the 256 bytes.

    pad ``<|endoftext|>``, eos ``<|im_end|>``, padding on the left, SmolLM2-like chat template.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        padding_side="left",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_config(
    tokenizer: PreTrainedTokenizerFast, *, arch: str = "llama", hidden: int = 64, layers: int = 2
) -> PretrainedConfig:
    """A small llama/qwen2 config whose vocab and special ids match ``tokenizer``."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"unknown tiny arch {arch!r}: use 'llama' or 'qwen2'")


def tiny_causal_lm(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    arch: str = "llama",
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
) -> PreTrainedModel:
    """Random-weight float32 causal LM, deterministic for a given ``seed``."""
    tokenizer = tokenizer or tiny_tokenizer()
    config = tiny_config(tokenizer, arch=arch, hidden=hidden, layers=layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def save_tiny_model(
    directory: str | Path,
    *,
    arch: str = "llama",
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write a local model folder (safetensors + tokenizer) usable as a model path in configs."""
    directory = Path(directory)
    tokenizer = tiny_tokenizer()
    model = tiny_causal_lm(tokenizer, arch=arch, hidden=hidden, layers=layers, seed=seed)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def qwen2_0_5b_config() -> Qwen2Config:
    """Qwen2.5-0.5B(-Instruct) shapes: 24 layers, hidden 896, 14 heads / 2 KV heads, tied."""
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )


def qwen2_7b_config() -> Qwen2Config:
    """Qwen2.5-7B(-Instruct) shapes: 28 layers, hidden 3584, 28 heads / 4 KV heads, untied."""
    return Qwen2Config(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
