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


def decoder_config(cls, vocab, hidden, intermediate, layers, heads, kv_heads, **rest):
    """A transformers decoder config ``cls`` from the shapes that tell models apart (vocab,
    hidden and MLP width, layers, query / KV heads); ``rest`` passes other fields."""
    return cls(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        **rest,
    )


def tiny_config(
    tokenizer: PreTrainedTokenizerFast, *, arch: str = "llama", hidden: int = 64, layers: int = 2
) -> PretrainedConfig:
    """A small llama/qwen2 config whose vocab and special ids match ``tokenizer``."""
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}.get(arch)
    if cls is None:
        raise ValueError(f"unknown tiny arch {arch!r}: use 'llama' or 'qwen2'")
    return decoder_config(
        cls,
        len(tokenizer),
        hidden,
        2 * hidden,
        layers,
        4,
        2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


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


# What Qwen2.5's sizes share: 32k positions, RoPE base 1e6, the same special ids.
_QWEN2 = dict(
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    bos_token_id=151643,
    eos_token_id=151645,
    pad_token_id=151643,
)


def qwen2_0_5b_config() -> Qwen2Config:
    """Qwen2.5-0.5B(-Instruct) shapes: 24 layers, hidden 896, 14 heads / 2 KV heads, tied."""
    return decoder_config(
        Qwen2Config, 151936, 896, 4864, 24, 14, 2, tie_word_embeddings=True, **_QWEN2
    )


def qwen2_7b_config() -> Qwen2Config:
    """Qwen2.5-7B(-Instruct) shapes: 28 layers, hidden 3584, 28 heads / 4 KV heads, untied."""
    return decoder_config(
        Qwen2Config, 152064, 3584, 18944, 28, 28, 4, tie_word_embeddings=False, **_QWEN2
    )


def smollm2_135m_config() -> LlamaConfig:
    """SmolLM2-135M(-Instruct) shapes: 30 layers, hidden 576, 9 heads / 3 KV heads, tied."""
    return decoder_config(
        LlamaConfig,
        49152,
        576,
        1536,
        30,
        9,
        3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
