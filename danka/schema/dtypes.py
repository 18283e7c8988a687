"""dtype names as users write them (no imports: every layer may use it without a cycle)."""

from __future__ import annotations

# short dtype names accepted everywhere a dtype is named (config, --dtype of the tools)
DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}


def canonical_dtype(name: str) -> str:
    """``bf16`` -> ``bfloat16``, ``fp16`` -> ``float16``, ``fp32`` -> ``float32``; other
    names pass through (lower-cased)."""
    return DTYPE_ALIASES.get(name.lower(), name.lower())
