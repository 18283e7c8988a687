"""A model's dimensions from its transformers config, without weights: H hidden, I
intermediate, L layers, V vocabulary, q = heads x head_dim, kv = kv_heads x head_dim (the
text part of a multimodal config). The memory plan (danka.planning) and vLLM's share
(danka.rollout.vllm.memory) price the same model, so both read it here."""

from __future__ import annotations

from typing import Any


def text_config(config: Any) -> Any:
    """The config of the language model: a multimodal config's text part, else itself."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def dims(config: Any) -> dict[str, int]:
    """H, I, L, V, q and kv of a transformers config."""
    tc = text_config(config)
    heads = tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    kv_heads = getattr(tc, "num_key_value_heads", None) or heads
    return {
        "H": tc.hidden_size,
        "I": getattr(tc, "intermediate_size", 4 * tc.hidden_size),
        "L": tc.num_hidden_layers,
        "V": tc.vocab_size,
        "q": heads * head_dim,
        "kv": kv_heads * head_dim,
    }
