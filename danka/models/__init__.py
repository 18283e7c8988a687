"""Models: loading (local folder, GGUF, Hub id, offline SmolLM2), LoRA, value head, log-probs."""
