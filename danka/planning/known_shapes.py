"""The shapes of the model families danka prices without a config file: ``danka estimate``
and ``trainer.micro_batch_size: auto`` need a model's dimensions before any weights load,
and a Hub id with no network and no HF cache has no ``config.json`` to read.

The numbers are each model's public ``config.json`` values (vocabulary, hidden and MLP
width, layers, query / KV heads, head size where it is not hidden / heads, tied
embeddings); a base model and its ``-Instruct`` share them, and so does any repository of
the same name under another owner (a fine-tune keeps its base's shape). The plan reads
nothing else of a config, so nothing else is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnownShape:
    """One architecture's dimensions, as its ``config.json`` spells them."""

    arch: str  # "qwen2" (attention biases) or "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool
    head_dim: int | None = None  # None: hidden_size // num_attention_heads

    def config(self) -> Any:
        """The transformers config (Qwen2Config or LlamaConfig) with these dimensions."""
        from transformers import LlamaConfig, Qwen2Config

        fields = {k: v for k, v in vars(self).items() if k != "arch" and v is not None}
        return {"qwen2": Qwen2Config, "llama": LlamaConfig}[self.arch](**fields)


def _qwen(vocab, hidden, mlp, layers, heads, kv, tied) -> KnownShape:
    return KnownShape("qwen2", vocab, hidden, mlp, layers, heads, kv, tied)


# Qwen2.5 and Qwen2.5-Coder share these per size (Qwen2 too, at its 0.5B, 1.5B and 7B).
QWEN25 = {
    "0.5b": _qwen(151936, 896, 4864, 24, 14, 2, True),
    "1.5b": _qwen(151936, 1536, 8960, 28, 12, 2, True),
    "3b": _qwen(151936, 2048, 11008, 36, 16, 2, True),
    "7b": _qwen(152064, 3584, 18944, 28, 28, 4, False),
    "14b": _qwen(152064, 5120, 13824, 48, 40, 8, False),
    "32b": _qwen(152064, 5120, 27648, 64, 40, 8, False),
}
LLAMA32 = {
    "1b": KnownShape("llama", 128256, 2048, 8192, 16, 32, 8, True, head_dim=64),
    "3b": KnownShape("llama", 128256, 3072, 8192, 28, 24, 8, True, head_dim=128),
}
SMOLLM2 = {
    "135m": KnownShape("llama", 49152, 576, 1536, 30, 9, 3, True),
    "360m": KnownShape("llama", 49152, 960, 2560, 32, 15, 5, True),
    "1.7b": KnownShape("llama", 49152, 2048, 8192, 24, 32, 32, True),
}
FAMILIES = "Qwen2.5, Qwen2.5-Coder, Qwen2 (0.5B-32B), Llama-3.2 (1B, 3B), SmolLM2 (135M-1.7B)"


def known_shapes() -> dict[str, KnownShape]:
    """Lower-case repository name (no owner) -> shape, base and ``-instruct`` alike."""
    names: dict[str, KnownShape] = {}
    for size, shape in QWEN25.items():
        for family in ("qwen2.5", "qwen2.5-coder"):
            names[f"{family}-{size}"] = shape
        if size in ("0.5b", "1.5b", "7b"):
            names[f"qwen2-{size}"] = shape
    names.update({f"llama-3.2-{size}": shape for size, shape in LLAMA32.items()})
    names.update({f"smollm2-{size}": shape for size, shape in SMOLLM2.items()})
    return names | {f"{name}-instruct": shape for name, shape in names.items()}


def known_config(name: str) -> Any | None:
    """The config of a known model by its Hub id (``Qwen/Qwen2.5-Coder-0.5B-Instruct``) or
    bare name, any owner; None for any other name."""
    shape = known_shapes().get(name.strip().rstrip("/").rsplit("/", 1)[-1].lower())
    return None if shape is None else shape.config()
